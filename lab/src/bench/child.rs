//! One launch, measured inside a fresh process: what each scenario of the benchmark runs.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use xnnblob::backend::{Backend, BackendOptions, machine_threads};
use xnnblob::delegate::{Weights, XnnDelegate};
use xnnblob::named_data::{FileDataMap, InMemoryMap, NamedDataMap};
use xnnblob::xnn::{InMemoryProvider, ProvidedWeightsCache, XnnpackWeightsCache};
use xnnblob_test_support::synthetic::model::ModelFiles;

/// How a launch gets its packed weights: what the benchmark compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// No weights cache: XNNPACK packs every weight privately.
    NoCache,
    /// XNNPACK's own in-memory weights cache, new in each process.
    XnnpackCache,
    /// xnnblob's packed-weight cache file, absent at launch: packs everything and saves it.
    Cold,
    /// xnnblob's packed-weight cache file, saved by an earlier launch: packs nothing.
    Warm,
    /// A provider already holding every packed weight: the best any cache can do.
    Floor,
}

impl Scenario {
    /// Every scenario, in the order the benchmark runs and reports them.
    pub const ALL: [Scenario; 5] = [
        Scenario::NoCache,
        Scenario::XnnpackCache,
        Scenario::Cold,
        Scenario::Warm,
        Scenario::Floor,
    ];

    /// The scenario's name on the command line (`--scenarios`) and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::NoCache => "no-cache",
            Scenario::XnnpackCache => "xnnpack-cache",
            Scenario::Cold => "xnnblob-cold",
            Scenario::Warm => "xnnblob-warm",
            Scenario::Floor => "floor",
        }
    }

    /// The scenario [`name`](Self::name) gives as `s`, if any.
    pub fn parse(s: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// What one launch measured (milliseconds, MiB).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Launch {
    /// Opening the `.ptd`, reading the payload, making the backend and opening the cache file, ms.
    pub open: f64,
    /// The delegate's init validating the payload and loading its constants, ms.
    pub load: f64,
    /// The delegate's init building the subgraph and creating the runtime (packing), ms.
    pub create: f64,
    /// The delegate's init finalizing the weights cache (a cold save starts here), ms.
    pub finalize: f64,
    /// From the launch's start to a delegate ready to run (`open` plus the whole init), ms.
    pub ready: f64,
    /// The first inference, ms.
    pub infer: f64,
    /// The process's peak resident set size (VmHWM) after the first inference, MiB.
    pub peak_rss: f64,
    /// The `.ptd`'s pages resident in the process after the first inference, MiB.
    pub weights_resident: f64,
    /// The packed-weight cache file's pages resident after the first inference, MiB.
    pub packed_resident: f64,
    /// Weights XNNPACK packed in this launch; `usize::MAX` when the scenario cannot count them.
    pub packed: usize,
    /// The sum of the first output's values, for checking that scenarios compute the same.
    pub checksum: f64,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Peak resident set size of this process (VmHWM), MiB.
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Resident bytes of this process's mappings of `path` (from /proc/self/smaps), MiB.
pub fn resident_mib(path: &Path) -> f64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return f64::NAN;
    };
    let name = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let name = name.to_string_lossy();
    let (mut inside, mut kb) = (false, 0u64);
    for line in smaps.lines() {
        let is_header = line.split_whitespace().next().is_some_and(|a| {
            a.contains('-') && a.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        });
        if is_header {
            inside = line.trim_end().ends_with(name.as_ref());
        } else if inside && let Some(v) = line.strip_prefix("Rss:") {
            kb += v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
    kb as f64 / 1024.0
}

fn payload_buffer(path: &Path) -> Result<xnnblob::named_data::DataBuffer, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut m = InMemoryMap::new("payload");
    m.insert("p", &bytes, 64, None).map_err(|e| e.to_string())?;
    m.get_data("p").map_err(|e| e.to_string())
}

/// Runs one launch of `scenario`; `cache_path` is the xnnblob cache file.
pub fn launch(
    scenario: Scenario,
    files: &ModelFiles,
    cache_path: &Path,
    input_len: usize,
) -> Result<Launch, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let start = Instant::now();
    let map = FileDataMap::open_ptd(&files.ptd).map_err(|x| e(&x))?;
    let payload = payload_buffer(&files.payload)?;
    // As an app's backend: as many threads as cores (a cold launch packs on them).
    let backend = Backend::new(BackendOptions {
        threads: machine_threads(),
        ..Default::default()
    })
    .map_err(|x| e(&x))?;
    let packed_cache = match scenario {
        Scenario::Cold | Scenario::Warm => Some(backend.file_cache(cache_path).map_err(|x| e(&x))?),
        _ => None,
    };
    let open = ms(start);
    let mut filler = None;
    let weights = match scenario {
        Scenario::NoCache => Weights::None,
        Scenario::XnnpackCache => {
            Weights::Xnnpack(Arc::new(XnnpackWeightsCache::new().map_err(|x| e(&x))?))
        }
        Scenario::Cold | Scenario::Warm => Weights::Packed(packed_cache.clone().expect("opened")),
        Scenario::Floor => {
            // The best any cache can do: a provider that already holds every packed weight of
            // these very buffers (filled by an untimed first delegate), so every look-up hits.
            let provider = Arc::new(ProvidedWeightsCache::new(InMemoryProvider::new()));
            // It stays alive, so the shared buffers keep their addresses.
            filler = Some(
                XnnDelegate::init(
                    &backend
                        .model_with_weights(Weights::Provider(provider.clone()))
                        .map_err(|x| e(&x))?,
                    payload.clone(),
                    &map,
                )
                .map_err(|x| e(&x))?,
            );
            Weights::Provider(provider)
        }
    };
    let delegate_start = Instant::now();
    let model = backend
        .model_with_weights(weights.clone())
        .map_err(|x| e(&x))?;
    let mut delegate = XnnDelegate::init(&model, payload, &map).map_err(|x| e(&x))?;
    let timings = delegate.init_timings();
    let ready = open + ms(delegate_start);
    let input: Vec<f32> = (0..input_len)
        .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
        .collect();
    let out_len: usize = delegate.output_shapes()[0].iter().product();
    let mut out = vec![0f32; out_len];
    let t = Instant::now();
    delegate
        .execute_f32(&[&input], &mut [&mut out])
        .map_err(|x| e(&x))?;
    let infer = ms(t);
    drop(filler);
    let packed = match &weights {
        Weights::Packed(c) => c.stats().packed,
        // Only the measured delegate's packing: the filler packed everything once.
        Weights::Provider(p) => p.stats().reserve_space_calls - p.stats().entries,
        _ => usize::MAX,
    };
    Ok(Launch {
        open,
        load: timings.load.as_secs_f64() * 1e3,
        create: timings.create.as_secs_f64() * 1e3,
        finalize: timings.finalize.as_secs_f64() * 1e3,
        ready,
        infer,
        peak_rss: peak_rss_mib(),
        weights_resident: resident_mib(&files.ptd),
        packed_resident: resident_mib(cache_path),
        packed,
        checksum: out.iter().map(|v| *v as f64).sum(),
    })
}

impl Launch {
    /// The child's report line: `LAUNCH ` and the measurements as one JSON object.
    pub fn to_line(&self) -> String {
        let json = serde_json::to_string(self).expect("plain numbers serialise");
        format!("LAUNCH {json}")
    }

    /// A report line back; None for any other line or a malformed one.
    pub fn from_line(line: &str) -> Option<Launch> {
        serde_json::from_str(line.strip_prefix("LAUNCH ")?).ok()
    }
}

/// 100 unload/reload cycles of a warm model in one process: the cache file must not change.
pub fn reload_cycles(
    files: &ModelFiles,
    cache_path: &Path,
    cycles: usize,
    input_len: usize,
) -> Result<String, String> {
    let before =
        std::fs::metadata(cache_path).map_err(|e| format!("{}: {e}", cache_path.display()))?;
    let map = FileDataMap::open_ptd(&files.ptd).map_err(|e| e.to_string())?;
    let mut packed = 0;
    for _ in 0..cycles {
        let backend = Backend::with_defaults().map_err(|e| e.to_string())?;
        let cache = backend.file_cache(cache_path).map_err(|e| e.to_string())?;
        let model = backend
            .model_with_weights(Weights::Packed(cache.clone()))
            .map_err(|e| e.to_string())?;
        let mut d = XnnDelegate::init(&model, payload_buffer(&files.payload)?, &map)
            .map_err(|e| e.to_string())?;
        let input = vec![0.5f32; input_len];
        let mut out = vec![0f32; d.output_shapes()[0].iter().product()];
        d.execute_f32(&[&input], &mut [&mut out])
            .map_err(|e| e.to_string())?;
        packed += cache.stats().packed;
    }
    let after = std::fs::metadata(cache_path).map_err(|e| e.to_string())?;
    Ok(format!(
        "RELOAD cycles={cycles} growth={} mtime_unchanged={} packed={packed}",
        after.len() as i64 - before.len() as i64,
        after.modified().ok() == before.modified().ok()
    ))
}

#[cfg(test)]
mod tests {
    use super::Launch;

    #[test]
    fn a_launch_line_round_trips() {
        let launch = Launch {
            open: 0.25,
            load: 1.5,
            create: 3.0,
            finalize: 0.125,
            ready: 4.875,
            infer: 2.0,
            peak_rss: 387.5,
            weights_resident: 0.0,
            packed_resident: 380.0,
            packed: 48,
            checksum: -12.5,
        };
        assert_eq!(Launch::from_line(&launch.to_line()), Some(launch));
        assert_eq!(Launch::from_line("LAUNCH {\"open\": 1}"), None);
        assert_eq!(Launch::from_line("RELOAD cycles=1"), None);
    }
}
