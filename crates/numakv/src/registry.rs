//! The engines this build knows: [`EngineKind`], their options ([`EngineOptions`]), and the one
//! `match` that turns a kind into its concrete engine type ([`EngineKind::with`]).
//!
//! # Adding an engine
//!
//! Everything engine-specific in the facade lives in this file:
//! 1. a variant of [`EngineKind`] and its entry in [`EngineKind::ALL`];
//! 2. its arm in [`EngineKind::with`] (the only place that names the engine type);
//! 3. a variant of [`EngineOptions`] with its arm in [`EngineOptions::kind`];
//! 4. an `impl EngineConfig` for the engine's options type: wrapping into / out of
//!    [`EngineOptions`] and its `key=value` option table (used by the CLI's `-o`).
//!
//! Everything else (create, open, close, inspect, the CLI) is generic over [`Engine`].

use std::fmt;
use std::str::FromStr;

use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::Engine;
use numakv_pmem::alloc::nsm::NsmMode;

use crate::error::{Error, Result};

/// The index engines a store can hold.
///
/// The name (`Display` / `FromStr`) is the one recorded in the store header.
///
/// ```
/// use numakv::EngineKind;
///
/// let kind: EngineKind = "fastfair".parse()?;
/// assert_eq!(kind, EngineKind::FastFair);
/// assert_eq!(kind.to_string(), "fastfair");
/// assert!(EngineKind::all().contains(&kind));
/// assert!("btree9000".parse::<EngineKind>().is_err());
/// # Ok::<(), numakv::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum EngineKind {
    /// FAST&FAIR (Hwang et al., FAST'18): PM-only B+-tree with failure-atomic shifts and
    /// in-place rebalancing, lock-free reads, B-link siblings. The baseline of every paper.
    FastFair,
}

impl EngineKind {
    /// Every engine this build knows, in a fixed order.
    pub const ALL: &'static [EngineKind] = &[EngineKind::FastFair];

    /// Every engine this build knows (same as [`EngineKind::ALL`]).
    pub fn all() -> &'static [EngineKind] {
        Self::ALL
    }

    /// Runs `f` with this kind's concrete engine type. This is the only `match` that names
    /// engine types; everything generic over [`Engine`] goes through it.
    pub(crate) fn with<F: WithEngine>(self, f: F) -> F::Output {
        match self {
            EngineKind::FastFair => f.run::<FastFair>(),
        }
    }

    /// The engine's name as recorded in store headers.
    pub fn name(self) -> &'static str {
        struct Name;
        impl WithEngine for Name {
            type Output = &'static str;
            fn run<E: Engine>(self) -> &'static str
            where
                E::Options: EngineConfig,
            {
                E::NAME
            }
        }
        self.with(Name)
    }

    /// The version of the engine's persistent format this build reads and writes.
    pub fn format_version(self) -> u32 {
        struct Version;
        impl WithEngine for Version {
            type Output = u32;
            fn run<E: Engine>(self) -> u32
            where
                E::Options: EngineConfig,
            {
                E::FORMAT_VERSION
            }
        }
        self.with(Version)
    }

    /// The kind whose [`EngineKind::name`] is `name`, if any.
    pub fn from_name(name: &str) -> Option<EngineKind> {
        Self::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The engine's options with the paper's defaults.
    pub fn default_options(self) -> EngineOptions {
        struct Defaults;
        impl WithEngine for Defaults {
            type Output = EngineOptions;
            fn run<E: Engine>(self) -> EngineOptions
            where
                E::Options: EngineConfig,
            {
                E::Options::default().wrap()
            }
        }
        self.with(Defaults)
    }

    /// The options the engine accepts as `key=value` text (e.g. on the command line).
    pub fn option_keys(self) -> &'static [OptionKey] {
        struct Keys;
        impl WithEngine for Keys {
            type Output = &'static [OptionKey];
            fn run<E: Engine>(self) -> &'static [OptionKey]
            where
                E::Options: EngineConfig,
            {
                <E::Options as EngineConfig>::KEYS
            }
        }
        self.with(Keys)
    }

    /// The known names, comma-separated, for messages.
    pub(crate) fn known_names() -> String {
        Self::ALL.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        EngineKind::from_name(&s.to_ascii_lowercase()).ok_or_else(|| Error::UnknownEngine {
            name: s.to_string(),
            known: EngineKind::known_names(),
        })
    }
}

/// Something generic over the engine type, run by [`EngineKind::with`].
pub(crate) trait WithEngine {
    type Output;
    fn run<E: Engine>(self) -> Self::Output
    where
        E::Options: EngineConfig;
}

/// Engine-specific options, one variant per engine, each with the paper's defaults
/// ([`EngineKind::default_options`]).
///
/// ```
/// use numakv::{EngineKind, EngineOptions};
///
/// let mut opts = EngineKind::FastFair.default_options();
/// opts.set("node_size", "1024")?;
/// let EngineOptions::FastFair(ff) = &opts else { unreachable!() };
/// assert_eq!(ff.node_size, 1024);
/// assert!(opts.set("colour", "blue").is_err());
/// # Ok::<(), numakv::Error>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum EngineOptions {
    /// Options of [`EngineKind::FastFair`].
    FastFair(FastFairOptions),
}

impl EngineOptions {
    /// The engine these options are for.
    pub fn kind(&self) -> EngineKind {
        match self {
            EngineOptions::FastFair(_) => EngineKind::FastFair,
        }
    }

    /// Sets one option from text, as listed by [`EngineKind::option_keys`].
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        struct Set<'a> {
            opts: &'a mut EngineOptions,
            key: &'a str,
            value: &'a str,
        }
        impl WithEngine for Set<'_> {
            type Output = Result<(), String>;
            fn run<E: Engine>(self) -> Result<(), String>
            where
                E::Options: EngineConfig,
            {
                let opts = E::Options::unwrap_mut(self.opts)
                    .ok_or_else(|| "options belong to another engine".to_string())?;
                opts.set(self.key, self.value)
            }
        }
        let engine = self.kind();
        engine
            .with(Set { opts: self, key, value })
            .map_err(|message| Error::BadEngineOption { engine, message })
    }

    /// Every option as `(key, value)` text, in [`EngineKind::option_keys`] order.
    pub fn values(&self) -> Vec<(&'static str, String)> {
        struct Values<'a>(&'a EngineOptions);
        impl WithEngine for Values<'_> {
            type Output = Vec<(&'static str, String)>;
            fn run<E: Engine>(self) -> Vec<(&'static str, String)>
            where
                E::Options: EngineConfig,
            {
                E::Options::unwrap(self.0).map(EngineConfig::values).unwrap_or_default()
            }
        }
        self.kind().with(Values(self))
    }
}

/// One engine option settable as `key=value` text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionKey {
    /// The key.
    pub key: &'static str,
    /// What it does, its accepted values and unit.
    pub help: &'static str,
}

/// What the facade needs of an engine's options type. Implemented here for each engine's
/// options (the engines themselves do not know the facade).
pub(crate) trait EngineConfig: Sized + Clone + Default {
    /// The options settable as text.
    const KEYS: &'static [OptionKey];
    /// Into the facade's enum.
    fn wrap(self) -> EngineOptions;
    /// Out of the facade's enum, if they are this engine's.
    fn unwrap(opts: &EngineOptions) -> Option<&Self>;
    /// Out of the facade's enum, mutably, if they are this engine's.
    fn unwrap_mut(opts: &mut EngineOptions) -> Option<&mut Self>;
    /// Sets `key` from text; the error names the key and the accepted values.
    fn set(&mut self, key: &str, value: &str) -> Result<(), String>;
    /// Every key with its current value as text.
    fn values(&self) -> Vec<(&'static str, String)>;
}

fn unknown_key(key: &str, keys: &[OptionKey]) -> String {
    let known = keys.iter().map(|k| k.key).collect::<Vec<_>>().join(", ");
    format!("unknown option {key:?} (options: {known})")
}

impl EngineConfig for FastFairOptions {
    const KEYS: &'static [OptionKey] = &[
        OptionKey {
            key: "node_size",
            help: "B+-tree node size in bytes, a multiple of 64 in 256..=4096 (512 in the paper)",
        },
        OptionKey {
            key: "nsm_mode",
            help: "where tree nodes are placed: local | round-robin | node:N",
        },
        OptionKey {
            key: "recovery",
            help: "open after a crash: lazy (instant: repair and garbage-collect in the \
                   background) | eager (walk and repair the whole tree before open returns)",
        },
    ];

    fn wrap(self) -> EngineOptions {
        EngineOptions::FastFair(self)
    }

    #[allow(unreachable_patterns)] // exhaustive while FastFair is the only engine
    fn unwrap(opts: &EngineOptions) -> Option<&Self> {
        match opts {
            EngineOptions::FastFair(o) => Some(o),
            _ => None,
        }
    }

    #[allow(unreachable_patterns)] // exhaustive while FastFair is the only engine
    fn unwrap_mut(opts: &mut EngineOptions) -> Option<&mut Self> {
        match opts {
            EngineOptions::FastFair(o) => Some(o),
            _ => None,
        }
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "node_size" => {
                self.node_size = crate::size::parse_size(value)
                    .ok()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| format!("node_size: {value:?} is not a size in bytes"))?;
            }
            "nsm_mode" => {
                self.nsm_mode = value.parse::<NsmMode>().map_err(|e| format!("nsm_mode: {e}"))?;
            }
            "recovery" => {
                self.recovery = value.parse().map_err(|e| format!("recovery: {e}"))?;
            }
            _ => return Err(unknown_key(key, Self::KEYS)),
        }
        Ok(())
    }

    fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("node_size", self.node_size.to_string()),
            ("nsm_mode", self.nsm_mode.to_string()),
            ("recovery", self.recovery.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &k in EngineKind::all() {
            assert_eq!(k.name().parse::<EngineKind>().unwrap(), k);
            assert_eq!(EngineKind::from_name(&k.to_string()), Some(k));
            assert_eq!(k.default_options().kind(), k);
            assert!(!k.option_keys().is_empty());
        }
        assert_eq!("FastFair".parse::<EngineKind>().unwrap(), EngineKind::FastFair);
        let err = "nope".parse::<EngineKind>().unwrap_err();
        assert!(err.to_string().contains("fastfair"), "{err}");
    }

    #[test]
    fn every_listed_key_can_be_set_back_from_its_value() {
        for &k in EngineKind::all() {
            let mut opts = k.default_options();
            let values = opts.values();
            let keys: Vec<_> = k.option_keys().iter().map(|o| o.key).collect();
            assert_eq!(values.iter().map(|(k, _)| *k).collect::<Vec<_>>(), keys);
            for (key, value) in values {
                opts.set(key, &value).unwrap();
            }
        }
    }

    #[test]
    fn bad_option_values_are_refused() {
        let mut o = EngineKind::FastFair.default_options();
        assert!(matches!(o.set("node_size", "big"), Err(Error::BadEngineOption { .. })));
        assert!(matches!(o.set("nsm_mode", "everywhere"), Err(Error::BadEngineOption { .. })));
        assert!(matches!(o.set("recovery", "later"), Err(Error::BadEngineOption { .. })));
        let err = o.set("nope", "1").unwrap_err().to_string();
        assert!(err.contains("node_size") && err.contains("nsm_mode"), "{err}");
        o.set("nsm_mode", "node:1").unwrap();
        o.set("node_size", "1K").unwrap();
        o.set("recovery", "eager").unwrap();
        let EngineOptions::FastFair(ff) = o;
        assert_eq!(ff.nsm_mode, NsmMode::Node(1));
        assert_eq!(ff.node_size, 1024);
        assert_eq!(ff.recovery, numakv_fastfair::RecoveryMode::Eager);
    }
}
