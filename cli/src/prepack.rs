//! `xnnblob prepack`: packed-weight caches made at build time, one per CPU class an app ships to,
//! so that the first launch on a device is warm (read-only layers: `xnnblob run --cache-layer`,
//! the drop-in's `packed_cache_layers`).
//!
//! A class's file is packed by XNNPACK itself, on a CPU of that class: this host when it is one,
//! else an emulated one (`qemu-x86_64 -cpu` for x86-64 classes, `qemu-aarch64 -cpu` with an
//! aarch64 build of this command for aarch64 ones). The child checks that XNNPACK picked the
//! class's kernels before it packs, so a file is never named for a class it was not packed for.
//! What a file serves is decided at run time by its recorded CPU's packing class
//! (`xnnblob::cache::packing_class`), never by its name.

use std::path::{Path, PathBuf};
use std::process::Command;
use xnnblob::xnn::{Qd8Weights, qd8_gemm_kernel};

/// The architecture a class's code runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// This build's.
    pub fn this() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }
}

/// A CPU class: a set of CPUs on which XNNPACK picks the same kernels, so packs alike.
#[derive(Debug)]
pub struct Class {
    /// Its name on the command line and in file names.
    pub name: &'static str,
    pub arch: Arch,
    /// The qemu CPU model that stands for it when the host is not one (None: only a host of
    /// the class can pack for it; qemu's TCG emulates no AVX-512 nor AMX).
    pub qemu_cpu: Option<&'static str>,
    /// What the name of every quantized GEMM kernel XNNPACK picks on it contains.
    pub kernel_family: &'static str,
    /// The CPUs it stands for, in words.
    pub cpus: &'static str,
}

/// The classes `prepack` knows, in the order `--list-classes` gives them.
pub const CLASSES: &[Class] = &[
    Class {
        name: "x86-64-avx2",
        arch: Arch::X86_64,
        qemu_cpu: Some("Haswell-v4"),
        kernel_family: "avx2",
        cpus: "x86-64 with AVX2 and FMA3, without AVX-512 or AVX-VNNI (Intel Haswell to Comet \
               Lake, AMD Zen 2 and 3); Zen 1 and Zen+ are not of it (XNNPACK packs their f32 \
               GEMM 16s4)",
    },
    Class {
        name: "x86-64-avx512vnni",
        arch: Arch::X86_64,
        qemu_cpu: None,
        kernel_family: "avx512vnni",
        cpus: "x86-64 with AVX512-VNNI (Intel Ice Lake and later servers, AMD Zen 4 and 5)",
    },
    Class {
        name: "x86-64-amx",
        arch: Arch::X86_64,
        qemu_cpu: None,
        kernel_family: "avx512amx",
        cpus: "x86-64 with AMX-INT8 granted by the OS (Intel Sapphire Rapids and later)",
    },
    Class {
        name: "aarch64-neon-mlal",
        arch: Arch::Aarch64,
        qemu_cpu: Some("cortex-a53"),
        kernel_family: "neon_mlal",
        cpus: "Armv8.0-A without the dot product (Cortex-A53, A55r0-class, A57, A72, A73)",
    },
    Class {
        name: "aarch64-neondot",
        arch: Arch::Aarch64,
        qemu_cpu: Some("neoverse-n1"),
        kernel_family: "neondot",
        cpus: "Armv8.2-A with the dot product and fp16 arithmetic, without i8mm (Cortex-A76, \
               A77, A78, Neoverse N1)",
    },
    Class {
        name: "aarch64-i8mm",
        arch: Arch::Aarch64,
        qemu_cpu: Some("max,sme=off"),
        kernel_family: "neoni8mm",
        cpus: "Armv8.6-A and Armv9-A with i8mm, SVE2 and BF16, without SME (Cortex-A710, X2 and \
               later, Neoverse V1/N2)",
    },
];

/// The class named `name`.
pub fn class(name: &str) -> Result<&'static Class, String> {
    CLASSES.iter().find(|c| c.name == name).ok_or_else(|| {
        let names: Vec<&str> = CLASSES.iter().map(|c| c.name).collect();
        format!(
            "no CPU class {name:?}: the classes are {} (xnnblob prepack --list-classes)",
            names.join(", ")
        )
    })
}

/// The file a class's cache of the program `stem` is written to in `out`.
pub fn file_for(out: &Path, stem: &str, class: &Class) -> PathBuf {
    out.join(format!(
        "{stem}.{}.{}",
        class.name,
        xnnblob::cache::CACHE_FILE_EXTENSION
    ))
}

/// The quantized GEMM kernels XNNPACK picks on this CPU, one per weight type it has one for.
pub fn kernels_here() -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for weights in Qd8Weights::ALL {
        match qd8_gemm_kernel(weights) {
            Ok(Some(name)) => names.push(name),
            Ok(None) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(names)
}

/// Whether this CPU is of `class`: this build's architecture, and every quantized GEMM kernel
/// XNNPACK picks here of its family. Err says what XNNPACK picks instead.
pub fn check_here(class: &Class) -> Result<(), String> {
    if Arch::this() != Some(class.arch) {
        return Err(format!("this build is not for {}", class.name));
    }
    let kernels = kernels_here()?;
    let foreign: Vec<&String> = kernels
        .iter()
        .filter(|k| !k.contains(class.kernel_family))
        .collect();
    if kernels.is_empty() || !foreign.is_empty() {
        return Err(format!(
            "this CPU is not of class {}: XNNPACK picks {}",
            class.name,
            kernels.join(", ")
        ));
    }
    // Its kernels are the class's, but its model may lay some weights out as no other CPU of
    // the class does: then the class is packed on its emulated CPU.
    if let Some(layout) = xnnblob::cache::x86_model_layout(xnnblob::cache::cpu_fingerprint()) {
        return Err(format!(
            "this CPU's kernels are class {}'s, but {layout}, unlike the class's other CPUs",
            class.name
        ));
    }
    Ok(())
}

/// How a class's file is made from this host: here, or the command line of a child that makes
/// it on an emulated CPU of the class (`tool` is this command built for the class's
/// architecture).
pub fn emulated_command(class: &Class, tool: &Path) -> Result<Command, String> {
    let cpu = class.qemu_cpu.ok_or_else(|| {
        format!(
            "class {} can only be packed on a CPU of the class (qemu emulates none)",
            class.name
        )
    })?;
    let mut command = match class.arch {
        Arch::X86_64 => Command::new("qemu-x86_64"),
        Arch::Aarch64 => {
            let mut c = Command::new("qemu-aarch64");
            // Debian's cross toolchain puts the aarch64 loader and libraries here.
            c.args(["-L", "/usr/aarch64-linux-gnu"]);
            c
        }
    };
    command.args(["-cpu", cpu]).arg(tool);
    Ok(command)
}
