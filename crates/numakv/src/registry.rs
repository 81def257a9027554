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
use std::time::Duration;

use numakv_f3tree::{Evaluation, F3Tree, F3TreeOptions};
use numakv_fastfair::{FastFair, FastFairOptions};
use numakv_index::Engine;
use numakv_nap::{Nap, NapOptions, SwitchMode};
use numakv_nbtree::{NbTree, NbTreeOptions, Variant as NbTreeVariant};
use numakv_nobtree::{Nobtree, NobtreeOptions};
use numakv_nstore::{CacheMode, NStore, NStoreOptions};
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
    /// Nap (Wang et al., OSDI'21) over FAST&FAIR: DRAM global view and per-node PM partial views
    /// of the hot keys, hot-set switch; the raw tree holds the rest.
    NapFastFair,
    /// NOBtree (Chu et al., TCAD'24): per-NUMA-node replicas of a static upper layer over
    /// write-optimized PM subindexes, node migration, NSM placement.
    Nobtree,
    /// NStore (papers/nstore.txt): per-node per-hash-cluster PM logs (Nlog) with only local PM
    /// writes, a volatile ordered index, the NUMA-aware RAF cache, GC and parallel recovery.
    NStore,
    /// NBTree (papers/nbtree.txt): lock-free B+-tree for persistent-cache (eADR) PM with DRAM
    /// leaf metadata over PM key-value blocks, three-phase SMO, Calloc.
    NbTree,
    /// F3-tree (papers/f3tree.txt): per-thread persistent future objects on the writer's node,
    /// a DRAM hash table of pending keys, per-node evaluate threads checkpointing into a global
    /// FAST&FAIR tree.
    F3Tree,
    /// Nap over NBTree: the same layer as [`EngineKind::NapFastFair`] over a different raw
    /// engine (Nap is a black box over any index).
    NapNbTree,
    /// Nap over NOBtree.
    NapNobtree,
    /// Nap over NStore.
    NapNStore,
    /// Nap over F3-tree.
    NapF3Tree,
}

impl EngineKind {
    /// Every engine this build knows, in a fixed order.
    pub const ALL: &'static [EngineKind] = &[
        EngineKind::FastFair,
        EngineKind::NapFastFair,
        EngineKind::Nobtree,
        EngineKind::NStore,
        EngineKind::NbTree,
        EngineKind::F3Tree,
        EngineKind::NapNbTree,
        EngineKind::NapNobtree,
        EngineKind::NapNStore,
        EngineKind::NapF3Tree,
    ];

    /// Every engine this build knows (same as [`EngineKind::ALL`]).
    pub fn all() -> &'static [EngineKind] {
        Self::ALL
    }

    /// Runs `f` with this kind's concrete engine type. This is the only `match` that names
    /// engine types; everything generic over [`Engine`] goes through it.
    pub(crate) fn with<F: WithEngine>(self, f: F) -> F::Output {
        match self {
            EngineKind::FastFair => f.run::<FastFair>(),
            EngineKind::NapFastFair => f.run::<Nap<FastFair>>(),
            EngineKind::Nobtree => f.run::<Nobtree>(),
            EngineKind::NStore => f.run::<NStore>(),
            EngineKind::NbTree => f.run::<NbTree>(),
            EngineKind::F3Tree => f.run::<F3Tree>(),
            EngineKind::NapNbTree => f.run::<Nap<NbTree>>(),
            EngineKind::NapNobtree => f.run::<Nap<Nobtree>>(),
            EngineKind::NapNStore => f.run::<Nap<NStore>>(),
            EngineKind::NapF3Tree => f.run::<Nap<F3Tree>>(),
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
    /// Options of [`EngineKind::NapFastFair`].
    NapFastFair(NapOptions<FastFairOptions>),
    /// Options of [`EngineKind::Nobtree`].
    Nobtree(NobtreeOptions),
    /// Options of [`EngineKind::NStore`].
    NStore(NStoreOptions),
    /// Options of [`EngineKind::NbTree`].
    NbTree(NbTreeOptions),
    /// Options of [`EngineKind::F3Tree`].
    F3Tree(F3TreeOptions),
    /// Options of [`EngineKind::NapNbTree`].
    NapNbTree(NapOptions<NbTreeOptions>),
    /// Options of [`EngineKind::NapNobtree`].
    NapNobtree(NapOptions<NobtreeOptions>),
    /// Options of [`EngineKind::NapNStore`].
    NapNStore(NapOptions<NStoreOptions>),
    /// Options of [`EngineKind::NapF3Tree`].
    NapF3Tree(NapOptions<F3TreeOptions>),
}

impl EngineOptions {
    /// The engine these options are for.
    pub fn kind(&self) -> EngineKind {
        match self {
            EngineOptions::FastFair(_) => EngineKind::FastFair,
            EngineOptions::NapFastFair(_) => EngineKind::NapFastFair,
            EngineOptions::Nobtree(_) => EngineKind::Nobtree,
            EngineOptions::NStore(_) => EngineKind::NStore,
            EngineOptions::NbTree(_) => EngineKind::NbTree,
            EngineOptions::F3Tree(_) => EngineKind::F3Tree,
            EngineOptions::NapNbTree(_) => EngineKind::NapNbTree,
            EngineOptions::NapNobtree(_) => EngineKind::NapNobtree,
            EngineOptions::NapNStore(_) => EngineKind::NapNStore,
            EngineOptions::NapF3Tree(_) => EngineKind::NapF3Tree,
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

    /// The smallest capacity per node file a store with these options needs before any data
    /// (e.g. NStore's preallocated log files), for sizing stores; 0 when the data alone decides.
    pub fn min_capacity_per_node(&self, page_size: u64) -> u64 {
        struct Min<'a>(&'a EngineOptions, u64);
        impl WithEngine for Min<'_> {
            type Output = u64;
            fn run<E: Engine>(self) -> u64
            where
                E::Options: EngineConfig,
            {
                E::Options::unwrap(self.0).map_or(0, |o| o.min_capacity_per_node(self.1))
            }
        }
        self.kind().with(Min(self, page_size))
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
    /// The smallest node-file capacity these options can work with, for sizing stores (e.g. a
    /// log-structured engine's preallocated files); 0 when the data alone decides.
    fn min_capacity_per_node(&self, _page_size: u64) -> u64 {
        0
    }
}

/// The three [`EngineConfig`] functions that move options into and out of
/// `EngineOptions::$variant`.
macro_rules! options_variant {
    ($variant:ident) => {
        fn wrap(self) -> EngineOptions {
            EngineOptions::$variant(self)
        }

        fn unwrap(opts: &EngineOptions) -> Option<&Self> {
            match opts {
                EngineOptions::$variant(o) => Some(o),
                _ => None,
            }
        }

        fn unwrap_mut(opts: &mut EngineOptions) -> Option<&mut Self> {
            match opts {
                EngineOptions::$variant(o) => Some(o),
                _ => None,
            }
        }
    };
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

    options_variant!(FastFair);

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

/// Nap's own keys; a Nap engine's table is these followed by its raw engine's.
const NAP_OWN_KEYS: &[OptionKey] = &[
    OptionKey { key: "hot", help: "hot-set size in keys (100000 in the paper)" },
    OptionKey {
        key: "sample",
        help: "record one operation in N per thread (32); 0: no hot-set tracking",
    },
    OptionKey { key: "check_period_ms", help: "period of the hot-set check in milliseconds (200)" },
    OptionKey {
        key: "switch_threshold",
        help: "switch when more than this share of hot keys differ (0.25)",
    },
    OptionKey { key: "sketch_width", help: "count-min sketch counters per row (850000; 3 rows)" },
    OptionKey {
        key: "detect_uniform",
        help: "install the empty NAL under uniform workloads: true | false",
    },
    OptionKey {
        key: "background",
        help: "run the switch thread: true | false (false: no switches)",
    },
    OptionKey {
        key: "switch_mode",
        help: "NAL switch: three-phase (the paper's) | global-lock (Fig. 15's contrast)",
    },
];

/// `a` then `b`, as one array (option tables of layered engines, built at compile time).
const fn concat_keys<const N: usize>(a: &[OptionKey], b: &[OptionKey]) -> [OptionKey; N] {
    assert!(a.len() + b.len() == N, "concat_keys: wrong length");
    let mut out = [OptionKey { key: "", help: "" }; N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out[i + j] = b[j];
        j += 1;
    }
    out
}

/// A raw engine's options that a Nap layer wraps in the facade (`nap-<engine>`): where the
/// layered engine's options sit in [`EngineOptions`], and its option table.
pub(crate) trait NapRawConfig: EngineConfig {
    /// [`NAP_OWN_KEYS`] followed by the raw engine's keys.
    const NAP_KEYS: &'static [OptionKey];
    fn wrap_nap(opts: NapOptions<Self>) -> EngineOptions;
    fn unwrap_nap(opts: &EngineOptions) -> Option<&NapOptions<Self>>;
    fn unwrap_nap_mut(opts: &mut EngineOptions) -> Option<&mut NapOptions<Self>>;
}

/// Implements [`NapRawConfig`] for `$raw` whose layered options are `EngineOptions::$variant`.
macro_rules! nap_raw_config {
    ($raw:ty, $variant:ident) => {
        impl NapRawConfig for $raw {
            const NAP_KEYS: &'static [OptionKey] = &{
                const N: usize = NAP_OWN_KEYS.len() + <$raw as EngineConfig>::KEYS.len();
                concat_keys::<N>(NAP_OWN_KEYS, <$raw as EngineConfig>::KEYS)
            };
            fn wrap_nap(opts: NapOptions<Self>) -> EngineOptions {
                EngineOptions::$variant(opts)
            }
            fn unwrap_nap(opts: &EngineOptions) -> Option<&NapOptions<Self>> {
                match opts {
                    EngineOptions::$variant(o) => Some(o),
                    _ => None,
                }
            }
            fn unwrap_nap_mut(opts: &mut EngineOptions) -> Option<&mut NapOptions<Self>> {
                match opts {
                    EngineOptions::$variant(o) => Some(o),
                    _ => None,
                }
            }
        }
    };
}

nap_raw_config!(FastFairOptions, NapFastFair);
nap_raw_config!(NbTreeOptions, NapNbTree);
nap_raw_config!(NobtreeOptions, NapNobtree);
nap_raw_config!(NStoreOptions, NapNStore);
nap_raw_config!(F3TreeOptions, NapF3Tree);

fn parse<T: FromStr>(key: &str, value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("{key}: {value:?} is not a valid value"))
}

impl<O: NapRawConfig> EngineConfig for NapOptions<O> {
    const KEYS: &'static [OptionKey] = O::NAP_KEYS;

    fn wrap(self) -> EngineOptions {
        O::wrap_nap(self)
    }

    fn unwrap(opts: &EngineOptions) -> Option<&Self> {
        O::unwrap_nap(opts)
    }

    fn unwrap_mut(opts: &mut EngineOptions) -> Option<&mut Self> {
        O::unwrap_nap_mut(opts)
    }

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "hot" => self.hot = parse(key, value)?,
            "sample" => self.sample = parse(key, value)?,
            "check_period_ms" => {
                let ms: u64 = parse(key, value)?;
                if ms == 0 {
                    return Err("check_period_ms must be positive".into());
                }
                self.check_period = std::time::Duration::from_millis(ms);
            }
            "switch_threshold" => {
                let t: f64 = parse(key, value)?;
                if !(0.0..=1.0).contains(&t) {
                    return Err(format!("switch_threshold: {t} is not in 0..=1"));
                }
                self.switch_threshold = t;
            }
            "sketch_width" => self.sketch_width = parse(key, value)?,
            "detect_uniform" => self.detect_uniform = parse(key, value)?,
            "background" => self.background = parse(key, value)?,
            "switch_mode" => {
                self.switch_mode = match value {
                    "three-phase" => SwitchMode::ThreePhase,
                    "global-lock" => SwitchMode::GlobalLock,
                    _ => {
                        return Err(format!(
                            "switch_mode: {value:?} is not three-phase | global-lock"
                        ))
                    }
                }
            }
            _ if O::KEYS.iter().any(|k| k.key == key) => self.inner.set(key, value)?,
            _ => return Err(unknown_key(key, Self::KEYS)),
        }
        Ok(())
    }

    fn values(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("hot", self.hot.to_string()),
            ("sample", self.sample.to_string()),
            ("check_period_ms", self.check_period.as_millis().to_string()),
            ("switch_threshold", self.switch_threshold.to_string()),
            ("sketch_width", self.sketch_width.to_string()),
            ("detect_uniform", self.detect_uniform.to_string()),
            ("background", self.background.to_string()),
            (
                "switch_mode",
                match self.switch_mode {
                    SwitchMode::ThreePhase => "three-phase",
                    SwitchMode::GlobalLock => "global-lock",
                }
                .to_string(),
            ),
        ];
        v.extend(self.inner.values());
        v
    }

    fn min_capacity_per_node(&self, page_size: u64) -> u64 {
        self.inner.min_capacity_per_node(page_size)
    }
}

impl EngineConfig for NobtreeOptions {
    const KEYS: &'static [OptionKey] = &[
        OptionKey {
            key: "height",
            help: "subindex height threshold: levels per subindex, 1..=8 (default 2); fixed at create",
        },
        OptionKey {
            key: "nsm_mode",
            help: "where bottom nodes are placed: round-robin (the paper's) | local | node:N",
        },
        OptionKey {
            key: "rebuild_threshold",
            help: "rebuild the upper layer when the average steps along the root list per insert exceed this",
        },
        OptionKey {
            key: "rebuild_min_ops",
            help: "inserts since the last rebuild before that average is trusted",
        },
        OptionKey { key: "migration", help: "the node-migration coordinator: on | off" },
        OptionKey {
            key: "migration_sample_every",
            help: "sample one operation in this many per thread (10 in the paper)",
        },
        OptionKey {
            key: "migration_hot_threshold",
            help: "sampled accesses within a window that make a node hot",
        },
        OptionKey {
            key: "migration_inner",
            help: "also migrate inner nodes and subindex roots, not only leaves: on | off",
        },
        OptionKey {
            key: "migration_cooldown",
            help: "samples (all threads) before a node made by a split or a migration may be queued; 0: none (default 2048)",
        },
        OptionKey {
            key: "background_rebuild",
            help: "rebuild the upper layer on a dedicated thread (the paper's): on | off",
        },
    ];

    options_variant!(Nobtree);

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        fn num<T: FromStr>(key: &str, value: &str) -> Result<T, String> {
            value.parse::<T>().map_err(|_| format!("{key}: {value:?} is not a number"))
        }
        match key {
            "height" => self.height = num(key, value)?,
            "nsm_mode" => {
                self.nsm_mode = value.parse::<NsmMode>().map_err(|e| format!("nsm_mode: {e}"))?;
            }
            "rebuild_threshold" => self.rebuild_threshold = num(key, value)?,
            "rebuild_min_ops" => self.rebuild_min_ops = num(key, value)?,
            "migration" => {
                self.migration.enabled = match value {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(format!("migration: {value:?} is not on | off")),
                }
            }
            "migration_sample_every" => self.migration.sample_every = num(key, value)?,
            "migration_hot_threshold" => self.migration.hot_threshold = num(key, value)?,
            "migration_cooldown" => self.migration.cooldown = num(key, value)?,
            "migration_inner" | "background_rebuild" => {
                let on = match value {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(format!("{key}: {value:?} is not on | off")),
                };
                if key == "migration_inner" {
                    self.migration.inner = on;
                } else {
                    self.background_rebuild = on;
                }
            }
            _ => return Err(unknown_key(key, Self::KEYS)),
        }
        Ok(())
    }

    fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("height", self.height.to_string()),
            ("nsm_mode", self.nsm_mode.to_string()),
            ("rebuild_threshold", self.rebuild_threshold.to_string()),
            ("rebuild_min_ops", self.rebuild_min_ops.to_string()),
            ("migration", if self.migration.enabled { "on" } else { "off" }.to_string()),
            ("migration_sample_every", self.migration.sample_every.to_string()),
            ("migration_hot_threshold", self.migration.hot_threshold.to_string()),
            ("migration_inner", if self.migration.inner { "on" } else { "off" }.to_string()),
            ("migration_cooldown", self.migration.cooldown.to_string()),
            ("background_rebuild", if self.background_rebuild { "on" } else { "off" }.to_string()),
        ]
    }
}

fn parse_num<T: FromStr>(key: &str, value: &str, what: &str) -> Result<T, String> {
    value.trim().parse().map_err(|_| format!("{key}: {value:?} is not {what}"))
}

fn parse_bytes(key: &str, value: &str) -> Result<u64, String> {
    crate::size::parse_size(value).map_err(|_| format!("{key}: {value:?} is not a size in bytes"))
}

impl EngineConfig for NStoreOptions {
    const KEYS: &'static [OptionKey] = &[
        OptionKey { key: "clusters", help: "hash clusters, 1..=65536 (256 in the paper)" },
        OptionKey {
            key: "log_file_size",
            help: "bytes of one Nlog file, rounded up to the page size (8M in the paper)",
        },
        OptionKey {
            key: "gc_threshold",
            help: "reclaim a log file once more than this share of its entries is garbage, \
                   0.0..1.0 (0.5 in the paper)",
        },
        OptionKey { key: "gc_threads", help: "GC threads per node, 0 = no GC (1 in the paper)" },
        OptionKey {
            key: "cache",
            help: "DRAM cache: raf (NUMA-weighted, the paper's) | lfu (unweighted) | off",
        },
        OptionKey { key: "cache_bytes", help: "DRAM bytes of the cache (64M in the paper)" },
        OptionKey { key: "cache_sample", help: "gets between two cache samples (32 in the paper)" },
        OptionKey {
            key: "recovery_threads",
            help: "scanning threads of crash recovery, 0 = one per core",
        },
        OptionKey { key: "scan_threads", help: "local read threads per node for scans" },
        OptionKey {
            key: "snapshot",
            help: "true | false: persist the index at clean shutdown for a fast reopen",
        },
    ];

    options_variant!(NStore);

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "clusters" => self.clusters = parse_num(key, value, "a cluster count")?,
            "log_file_size" => self.log_file_size = parse_bytes(key, value)?,
            "gc_threshold" => {
                let t: f64 = parse_num(key, value, "a share in 0.0..1.0")?;
                if !(0.0..1.0).contains(&t) {
                    return Err(format!("gc_threshold: {value} is not in 0.0..1.0"));
                }
                self.gc_threshold = t;
            }
            "gc_threads" => self.gc_threads_per_node = parse_num(key, value, "a thread count")?,
            "cache" => {
                self.cache = value.parse::<CacheMode>().map_err(|e| format!("cache: {e}"))?
            }
            "cache_bytes" => self.cache_bytes = parse_bytes(key, value)?,
            "cache_sample" => {
                self.cache_sample = parse_num(key, value, "a positive count")?;
                if self.cache_sample == 0 {
                    return Err("cache_sample: must be ≥ 1".into());
                }
            }
            "recovery_threads" => self.recovery_threads = parse_num(key, value, "a thread count")?,
            "scan_threads" => self.scan_threads_per_node = parse_num(key, value, "a thread count")?,
            "snapshot" => self.snapshot_on_close = parse_num(key, value, "true or false")?,
            _ => return Err(unknown_key(key, Self::KEYS)),
        }
        Ok(())
    }

    fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("clusters", self.clusters.to_string()),
            ("log_file_size", self.log_file_size.to_string()),
            ("gc_threshold", self.gc_threshold.to_string()),
            ("gc_threads", self.gc_threads_per_node.to_string()),
            ("cache", self.cache.to_string()),
            ("cache_bytes", self.cache_bytes.to_string()),
            ("cache_sample", self.cache_sample.to_string()),
            ("recovery_threads", self.recovery_threads.to_string()),
            ("scan_threads", self.scan_threads_per_node.to_string()),
            ("snapshot", self.snapshot_on_close.to_string()),
        ]
    }

    fn min_capacity_per_node(&self, page_size: u64) -> u64 {
        // Every cluster's first (small) file and the GC reserve; `create` refuses less.
        NStoreOptions::min_capacity_per_node(self, page_size)
    }
}

impl EngineConfig for NbTreeOptions {
    const KEYS: &'static [OptionKey] = &[
        OptionKey {
            key: "leaf_slots",
            help: "key-value entries per leaf, 2..=63 (63 = 1 KB PM blocks, the paper's node size; 31 = the prototype's 512 bytes)",
        },
        OptionKey {
            key: "variant",
            help: "leaf concurrency: lock-free (NBTree) | w (NBTree-W: leaf write locks) | \
                   wr (NBTree-WR: leaf locks for reads and writes)",
        },
        OptionKey {
            key: "coupled",
            help: "true: coupled leaves (metadata also in a PM line per leaf, Fig. 13); \
                   false: decoupled (the paper's design)",
        },
        OptionKey {
            key: "allocator",
            help: "leaf block allocator (Fig. 15): calloc (the paper's, recoverable) | naive \
                   (bump, never freed) | page-heap (needs page_size 4096); naive and page-heap \
                   stores cannot be reopened",
        },
    ];

    options_variant!(NbTree);

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "leaf_slots" => {
                self.leaf_slots = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("leaf_slots: {value:?} is not a number"))?;
            }
            "variant" => {
                self.variant =
                    value.parse::<NbTreeVariant>().map_err(|e| format!("variant: {e}"))?;
            }
            "coupled" => {
                self.coupled = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("coupled: {value:?} is not true or false"))?;
            }
            "allocator" => {
                self.allocator = value.parse().map_err(|e| format!("allocator: {e}"))?;
            }
            _ => return Err(unknown_key(key, Self::KEYS)),
        }
        Ok(())
    }

    fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("leaf_slots", self.leaf_slots.to_string()),
            ("variant", self.variant.name().to_string()),
            ("coupled", self.coupled.to_string()),
            ("allocator", self.allocator.name().to_string()),
        ]
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(format!("{key}: {value:?} is not true/false")),
    }
}

fn parse_f3_num<T: FromStr>(key: &str, value: &str) -> Result<T, String> {
    value.parse::<T>().map_err(|_| format!("{key}: {value:?} is not a number"))
}

impl EngineConfig for F3TreeOptions {
    const KEYS: &'static [OptionKey] = &[
        OptionKey {
            key: "node_size",
            help: "global FAST&FAIR tree node size in bytes, a multiple of 64 in 256..=4096",
        },
        OptionKey { key: "fo_entries", help: "key-value entries per future object, 1..=4094" },
        OptionKey {
            key: "fo_limit",
            help:
                "FOs per thread before the writer waits for evaluation: N >= 2 | unlimited (Fig. 6)",
        },
        OptionKey {
            key: "evaluators",
            help: "evaluate threads: per-node:N (F3-tree(N), default per-node:2) | total:N (N2: N \
                   in all, node-bound) | first-node:N (NI: N on node 0 serving every list) | \
                   unbound:N (N per node, unpinned, any list)",
        },
        OptionKey {
            key: "count_threshold",
            help: "evaluate a thread's PTFO once it holds this many entries",
        },
        OptionKey {
            key: "time_threshold_us",
            help: "... or once it holds any and was last evaluated this many microseconds ago",
        },
        OptionKey {
            key: "evaluation",
            help: "key (F3-K, entry by entry) | batched[:N] (F3-N, N entries sorted by key)",
        },
        OptionKey {
            key: "numa_aware",
            help: "true: FOs on the writer's node, tree nodes on the evaluator's; false: both \
                   interleaved over the nodes",
        },
        OptionKey {
            key: "hash_lookups",
            help: "true: lookups use the hash table; false: search PTFOs (Fig. 10 \"No Hash\")",
        },
    ];

    options_variant!(F3Tree);

    fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "node_size" => {
                self.node_size = crate::size::parse_size(value)
                    .ok()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| format!("node_size: {value:?} is not a size in bytes"))?;
            }
            "fo_entries" => self.fo_entries = parse_f3_num(key, value)?,
            "fo_limit" => {
                self.fo_limit = match value {
                    "unlimited" | "none" => None,
                    v => Some(parse_f3_num(key, v)?),
                }
            }
            "evaluators" => self.evaluators = value.parse()?,
            "count_threshold" => self.count_threshold = parse_f3_num(key, value)?,
            "time_threshold_us" => {
                self.time_threshold = Duration::from_micros(parse_f3_num(key, value)?);
            }
            "evaluation" => {
                self.evaluation = match value.split_once(':') {
                    None if value == "key" => Evaluation::KeyBased,
                    None if value == "batched" => Evaluation::NodeBatched { batch: 1024 },
                    Some(("batched", n)) => {
                        Evaluation::NodeBatched { batch: parse_f3_num(key, n)? }
                    }
                    _ => return Err(format!("evaluation: {value:?} is not key | batched[:N]")),
                }
            }
            "numa_aware" => self.numa_aware = parse_bool(key, value)?,
            "hash_lookups" => self.hash_lookups = parse_bool(key, value)?,
            _ => return Err(unknown_key(key, Self::KEYS)),
        }
        Ok(())
    }

    fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("node_size", self.node_size.to_string()),
            ("fo_entries", self.fo_entries.to_string()),
            ("fo_limit", self.fo_limit.map_or("unlimited".to_string(), |n| n.to_string())),
            ("evaluators", self.evaluators.to_string()),
            ("count_threshold", self.count_threshold.to_string()),
            ("time_threshold_us", self.time_threshold.as_micros().to_string()),
            (
                "evaluation",
                match self.evaluation {
                    Evaluation::KeyBased => "key".to_string(),
                    Evaluation::NodeBatched { batch } => format!("batched:{batch}"),
                },
            ),
            ("numa_aware", self.numa_aware.to_string()),
            ("hash_lookups", self.hash_lookups.to_string()),
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
        let EngineOptions::FastFair(ff) = o else { unreachable!() };
        assert_eq!(ff.nsm_mode, NsmMode::Node(1));
        assert_eq!(ff.node_size, 1024);
        assert_eq!(ff.recovery, numakv_fastfair::RecoveryMode::Eager);
    }
}
