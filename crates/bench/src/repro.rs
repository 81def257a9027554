//! Reproductions (stub).
