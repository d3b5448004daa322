//! Load time and peak memory of a model whose weights come from an ExecuTorch-style `.ptd`
//! (keys are the sha256 of the bytes), each scenario in a fresh child process:
//! - `no-cache`: XNNPACK packs every weight at every launch;
//! - `cold`: xnnblob's cache, no file yet: packs and saves;
//! - `warm`: xnnblob's cache, file present: maps it, packs nothing.
//!
//! `cargo bench --bench cache_load [-- --mib N --layers L --repeats R]`. Numbers are the
//! median (and min–max) of R runs measured in this one invocation.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use xnnblob::cache::{BlobId, PackedWeightsCache};
use xnnblob::named_data::{FileDataMap, NamedBlobStore, NamedDataMap};
use xnnblob::sha256::{sha256, to_hex};
use xnnblob::synthetic::SplitMix64;
use xnnblob::xnn::{Datatype, Runtime, Subgraph, ValueRole};

struct Spec {
    layers: usize,
    width: usize,
}

impl Spec {
    fn weight_bytes(&self) -> usize {
        self.layers * self.width * self.width * 4
    }
}

fn bench_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes the model's weights (and a bias per layer) as a `.ptd` keyed like ExecuTorch's
/// XNNPACK exporter does: by the sha256 hex of each blob.
fn write_model(spec: &Spec, path: &Path) {
    if path.exists() {
        return;
    }
    let mut store = NamedBlobStore::new();
    let mut rng = SplitMix64(2026);
    let scale = 1.0 / (spec.width as f32).sqrt();
    for _ in 0..spec.layers {
        let w: Vec<u8> = (0..spec.width * spec.width)
            .flat_map(|_| (rng.unit() * scale).to_le_bytes())
            .collect();
        let b: Vec<u8> = (0..spec.width)
            .flat_map(|_| (rng.unit() * 0.01).to_le_bytes())
            .collect();
        let (wk, bk) = (to_hex(&sha256(&w)), to_hex(&sha256(&b)));
        store.add_named_blob(&wk, &w, 64, "model", None).unwrap();
        store.add_named_blob(&bk, &b, 64, "model", None).unwrap();
    }
    // XNNPACK may read 16 bytes past a weight: never let the last one end the file.
    store
        .add_named_blob("slack", &[0u8; 4096], 64, "model", None)
        .unwrap();
    store.write_ptd("model", path).unwrap();
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// One launch: open the weights, create the runtime, finalize, run once. Prints one line.
fn child(scenario: &str, spec: &Spec, ptd: &Path, cache_path: &Path) {
    let start = Instant::now();
    let map = FileDataMap::open_ptd(ptd).unwrap();
    // Keys in file order: weight, bias, weight, bias, ..., slack.
    let keys: Vec<(String, String)> = (0..spec.layers)
        .map(|i| {
            let k = |j| map.key_at(j).unwrap().to_string();
            (k(2 * i), k(2 * i + 1))
        })
        .collect();
    let buffers: Vec<_> = keys
        .iter()
        .map(|(w, b)| (map.get_data(w).unwrap(), map.get_data(b).unwrap()))
        .collect();
    let cache = match scenario {
        "no-cache" => None,
        _ => Some(PackedWeightsCache::open(cache_path).unwrap()),
    };
    let registrations: Vec<_> = match &cache {
        None => Vec::new(),
        Some(c) => keys
            .iter()
            .zip(&buffers)
            .flat_map(|((wk, bk), (w, b))| {
                [
                    c.register_buffer(w, BlobId::from_sha256_key(wk).unwrap()),
                    c.register_buffer(b, BlobId::from_sha256_key(bk).unwrap()),
                ]
            })
            .collect(),
    };
    let n = spec.width;
    let mut g = Subgraph::new(2).unwrap();
    let mut x = g.define_f32_tensor(&[1, n], ValueRole::Input(0)).unwrap();
    for (i, (w, b)) in buffers.iter().enumerate() {
        let last = i + 1 == buffers.len();
        let wv = g
            .define_tensor(Datatype::Fp32, &[n, n], ValueRole::Static(w.data()))
            .unwrap();
        let bv = g
            .define_tensor(Datatype::Fp32, &[n], ValueRole::Static(b.data()))
            .unwrap();
        let role = if last {
            ValueRole::Output(1)
        } else {
            ValueRole::Internal
        };
        let y = g.define_f32_tensor(&[1, n], role).unwrap();
        let min = if last { f32::NEG_INFINITY } else { 0.0 };
        g.define_fully_connected(x, wv, Some(bv), y, min, f32::INFINITY)
            .unwrap();
        x = y;
    }
    let opened = ms(start);
    let t = Instant::now();
    let mut rt = Runtime::new(&g, cache.as_deref().map(|c| c as _)).unwrap();
    let create = ms(t);
    drop(registrations);
    let t = Instant::now();
    if let Some(c) = &cache {
        c.finalize().unwrap();
    }
    let finalize = ms(t);
    let ready = ms(start);
    let input: Vec<f32> = (0..n).map(|i| (i as f32 * 0.1).sin()).collect();
    let mut out = vec![0f32; n];
    let t = Instant::now();
    rt.invoke(&[(0, &input)], &mut [(1, &mut out)]).unwrap();
    let infer = ms(t);
    let checksum: f64 = out.iter().map(|v| *v as f64).sum();
    let packed = cache.as_ref().map_or(buffers.len(), |c| c.stats().packed);
    println!(
        "RESULT open={opened:.3} create={create:.3} finalize={finalize:.3} ready={ready:.3} infer={infer:.3} peak_rss_mib={:.1} packed={packed} out={checksum:.6}",
        peak_rss_mib()
    );
}

fn parse(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let mib = arg("--mib", 256);
    let layers = arg("--layers", 16);
    let repeats = arg("--repeats", 5);
    let width = (((mib << 20) / layers / 4) as f64).sqrt() as usize / 64 * 64;
    let spec = Spec { layers, width };
    let dir = bench_dir();
    let ptd = dir.join(format!("cache_load-{layers}x{width}.ptd"));
    let cache_path = dir.join(format!("cache_load-{layers}x{width}.xbc"));
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(&args[i + 1], &spec, &ptd, &cache_path);
        return;
    }
    write_model(&spec, &ptd);
    println!(
        "model: {layers} fully connected layers {width}x{width} fp32 = {:.0} MiB of weights in {}",
        spec.weight_bytes() as f64 / (1 << 20) as f64,
        ptd.display()
    );
    let run = |scenario: &str| -> String {
        let out = Command::new(&args[0])
            .args(["--mib", &mib.to_string(), "--layers", &layers.to_string()])
            .args(["--child", scenario])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("RESULT"))
            .unwrap()
            .to_string()
    };
    let mut rows = Vec::new();
    for scenario in ["no-cache", "cold", "warm"] {
        let mut lines = Vec::new();
        for _ in 0..repeats {
            if scenario == "cold" {
                let _ = std::fs::remove_file(&cache_path);
            }
            lines.push(run(scenario));
        }
        rows.push((scenario, lines));
    }
    println!(
        "| scenario | load-to-ready ms (median, min-max) | create ms | finalize ms | first inference ms | peak RSS MiB | weights packed |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut ready = Vec::new();
    for (scenario, lines) in &rows {
        let col = |k: &str| median(lines.iter().map(|l| parse(l, k)).collect());
        let (r, rmin, rmax) = col("ready");
        ready.push(r);
        println!(
            "| {scenario} | {r:.1} ({rmin:.1}-{rmax:.1}) | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} |",
            col("create").0,
            col("finalize").0,
            col("infer").0,
            col("peak_rss_mib").0,
            col("packed").0
        );
    }
    let outs: Vec<f64> = rows.iter().map(|(_, l)| parse(&l[0], "out")).collect();
    println!(
        "warm speed-up vs no cache: {:.0}x; cold / no cache: {:.2}x; outputs identical: {}",
        ready[0] / ready[2],
        ready[1] / ready[0],
        outs.windows(2).all(|w| w[0] == w[1])
    );
    println!(
        "cache file: {} bytes",
        std::fs::metadata(&cache_path).map_or(0, |m| m.len())
    );
}
