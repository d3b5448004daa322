//! What the coverage-guided fuzz targets (`fuzz/`, docs/fuzzing.md) found, held fixed. The
//! inputs themselves are kept in the seed corpora (`fuzz/corpus/*/regression-*`), which
//! `tests/fuzz_short.rs` runs; these tests state each fix where it was made.

use xnnblob::backend::{Backend, WeightsCacheChoice};
use xnnblob::delegate::XnnDelegate;
use xnnblob::named_data::{FileDataMap, FileKind, InMemoryMap, NamedDataMap};
use xnnblob::xnn::{
    Convolution2dParams, DepthwiseConvolution2dParams, Runtime, Subgraph, ValueRole,
};

const INPUT: u32 = 0;
const OUTPUT: u32 = 1;

#[test]
fn payloads_claiming_ids_past_what_they_hold_are_refused_before_anything_is_allocated_for_them() {
    let refusal = |seed: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus/payload")
            .join(seed);
        let bytes = std::fs::read(path).unwrap();
        let mut holder = InMemoryMap::new("payload");
        holder.insert("p", &bytes, 64, None).unwrap();
        let backend = Backend::with_defaults().unwrap();
        let model = backend.model(Some(&WeightsCacheChoice::Disabled)).unwrap();
        let empty = InMemoryMap::new("no constants");
        XnnDelegate::init(&model, holder.get_data("p").unwrap(), &empty)
            .err()
            .expect("refused")
            .to_string()
    };
    // One byte of a payload's external id count changed: XNNPACK reserved 16 million values,
    // some 3 GB, when the subgraph was created.
    let e = refusal("regression-num-externs.xnn");
    assert!(e.contains("above ExecuTorch's 4096"), "{e}");
    // A node's operand id past every value's: the table of operands read as they are, by id,
    // grew to 4 G slots, which the fuzzer's allocator refused (it is a node's error, found
    // first). The process's peak resident memory shows such a table (filled, it is resident).
    let peak_kib = || -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .expect("VmHWM in /proc/self/status");
        line.trim().trim_end_matches("kB").trim().parse().unwrap()
    };
    let before = peak_kib();
    let e = refusal("regression-operand-id-past-every-value.xnn");
    assert!(e.contains("is not defined"), "{e}");
    let grew = peak_kib() - before;
    assert!(grew < 2 << 20, "the refusal took {grew} KiB");
}

/// An input `[1, 5, 5, 3]`, a static filter and bias of the given shapes, and an output.
fn operands<'d>(
    g: &mut Subgraph<'d>,
    filter_dims: &[usize],
    filter: &'d [f32],
    bias: &'d [f32],
    out_channels: usize,
) -> (u32, u32, u32, u32) {
    let input = g
        .define_f32_tensor(&[1, 5, 5, 3], ValueRole::Input(INPUT))
        .unwrap();
    let f = g
        .define_f32_tensor(filter_dims, ValueRole::static_f32(filter))
        .unwrap();
    let b = g
        .define_f32_tensor(&[bias.len()], ValueRole::static_f32(bias))
        .unwrap();
    let output = g
        .define_f32_tensor(&[1, 5, 5, out_channels], ValueRole::Output(OUTPUT))
        .unwrap();
    (input, f, b, output)
}

#[test]
fn a_convolution_whose_filter_or_bias_is_smaller_than_its_parameters_is_refused() {
    // Found as a kernel height of 4099 over a 3x3 filter: XNNPACK checks only the filter's
    // output channels and packed 4099 * 3 rows of weights from past its end (a segfault).
    let filter = vec![0.5f32; 4 * 3 * 3 * 3];
    let bias = vec![0.0f32; 4];
    let mut p = Convolution2dParams::new(3, 3, 3, 4);
    p.padding = xnnblob::xnn::Padding2d {
        top: 1,
        right: 1,
        bottom: 1,
        left: 1,
    };
    let mut g = Subgraph::new(2).unwrap();
    let (input, f, b, output) = operands(&mut g, &[4, 3, 3, 3], &filter, &bias, 4);
    g.define_convolution_2d(&p, input, f, Some(b), output)
        .expect("a filter of the kernel's size");

    for (kernel_height, bias_len) in [(4099, 4), (3, 3)] {
        let bias = vec![0.0f32; bias_len];
        let mut g = Subgraph::new(2).unwrap();
        let (input, f, b, output) = operands(&mut g, &[4, 3, 3, 3], &filter, &bias, 4);
        let p = Convolution2dParams { kernel_height, ..p };
        assert!(
            g.define_convolution_2d(&p, input, f, Some(b), output)
                .is_err(),
            "kernel height {kernel_height}, {bias_len} biases"
        );
    }
}

#[test]
fn a_depthwise_convolution_whose_filter_or_bias_is_smaller_than_its_parameters_is_refused() {
    let filter = vec![0.5f32; 3 * 3 * 3];
    let mut p = DepthwiseConvolution2dParams::new(3, 3, 3, 1);
    p.padding = xnnblob::xnn::Padding2d {
        top: 1,
        right: 1,
        bottom: 1,
        left: 1,
    };
    let bias = vec![0.0f32; 3];
    let mut g = Subgraph::new(2).unwrap();
    let (input, f, b, output) = operands(&mut g, &[1, 3, 3, 3], &filter, &bias, 3);
    g.define_depthwise_convolution_2d(&p, input, f, Some(b), output)
        .expect("a filter of the kernel's size");

    for (kernel_width, multiplier, bias_len) in [(5, 1, 3), (3, 2, 6), (3, 1, 2)] {
        let bias = vec![0.0f32; bias_len];
        let mut g = Subgraph::new(2).unwrap();
        let (input, f, b, output) = operands(&mut g, &[1, 3, 3, 3], &filter, &bias, 3 * multiplier);
        let p = DepthwiseConvolution2dParams {
            kernel_width,
            depth_multiplier: multiplier as u32,
            ..p
        };
        assert!(
            g.define_depthwise_convolution_2d(&p, input, f, Some(b), output)
                .is_err(),
            "kernel width {kernel_width}, multiplier {multiplier}, {bias_len} biases"
        );
    }
}

#[test]
fn a_fully_connected_bias_of_another_size_than_the_output_channels_is_refused() {
    // XNNPACK reads one bias per output channel of the filter, whatever the bias holds.
    let weights = vec![0.25f32; 8 * 4];
    for (bias_len, ok) in [(8, true), (2, false), (9, false)] {
        let bias = vec![0.0f32; bias_len];
        let mut g = Subgraph::new(2).unwrap();
        let input = g
            .define_f32_tensor(&[1, 4], ValueRole::Input(INPUT))
            .unwrap();
        let f = g
            .define_f32_tensor(&[8, 4], ValueRole::static_f32(&weights))
            .unwrap();
        let b = g
            .define_f32_tensor(&[bias_len], ValueRole::static_f32(&bias))
            .unwrap();
        let output = g
            .define_f32_tensor(&[1, 8], ValueRole::Output(OUTPUT))
            .unwrap();
        let defined = g.define_fully_connected(input, f, Some(b), output, f32::MIN, f32::MAX);
        assert_eq!(defined.is_ok(), ok, "{bias_len} biases for 8 outputs");
    }
}

#[test]
fn scalar_tensors_and_reshapes_to_a_scalar_are_refused() {
    // A payload's input declared with no dimensions, into a fully connected node: at reshape
    // XNNPACK copied rank - 1 (that is, usize::MAX) dimensions into the output's shape, past
    // the end of the runtime's values (glibc: "munmap_chunk(): invalid pointer"). Then the same
    // through an internal value that no node writes, which keeps its declared shape.
    let one = [1.0f32];
    let mut g = Subgraph::new(2).unwrap();
    for role in [
        ValueRole::Input(INPUT),
        ValueRole::static_f32(&one),
        ValueRole::Internal,
        ValueRole::Output(OUTPUT),
    ] {
        assert!(g.define_f32_tensor(&[], role).is_err());
    }
    assert!(
        g.define_dynamically_quantized_tensor(xnnblob::xnn::Datatype::Qdint8, &[], 0)
            .is_err()
    );
    let x = g.define_f32_tensor(&[1], ValueRole::Input(INPUT)).unwrap();
    let y = g.define_f32_tensor(&[1], ValueRole::Internal).unwrap();
    assert!(g.define_static_reshape(&[], x, y).is_err());
    g.define_static_reshape(&[1, 1], x, y)
        .expect("a reshape to a shape of its own");
}

#[test]
fn tensors_larger_than_any_buffer_are_refused() {
    // A payload declared an external input of more than 2^64 bytes; XNNPACK sizes tensors in
    // size_t, unchecked, so its size would wrap to a small one.
    let huge = [1usize << 62, 8];
    let mut g = Subgraph::new(2).unwrap();
    assert!(g.define_f32_tensor(&huge, ValueRole::Input(INPUT)).is_err());
    assert!(g.define_f32_tensor(&huge, ValueRole::Internal).is_err());
    assert!(
        g.define_f32_tensor(&[usize::MAX / 4 + 1], ValueRole::Output(OUTPUT))
            .is_err()
    );
    assert!(
        g.define_dynamically_quantized_tensor(xnnblob::xnn::Datatype::Qdint8, &huge, 1)
            .is_err()
    );
    g.define_f32_tensor(&[1 << 20, 8], ValueRole::Internal)
        .expect("a large tensor that fits");
}

#[test]
fn a_node_writing_an_input_or_a_constant_is_refused() {
    // A concatenation whose output id went missing (0, the first input's): XNNPACK wrote 32
    // floats into the caller's 8-float input buffer.
    let weights = [0.5f32; 8];
    let mut g = Subgraph::new(2).unwrap();
    let x = g
        .define_f32_tensor(&[1, 8], ValueRole::Input(INPUT))
        .unwrap();
    let c = g
        .define_f32_tensor(&[1, 8], ValueRole::static_f32(&weights))
        .unwrap();
    let y = g
        .define_f32_tensor(&[2, 8], ValueRole::Output(OUTPUT))
        .unwrap();
    assert!(g.define_concatenate2(0, c, x, x).is_err());
    assert!(g.define_concatenate2(0, x, x, c).is_err());
    assert!(g.define_copy(x, c).is_err());
    g.define_concatenate2(0, x, c, y).expect("into the output");
}

/// Creates a runtime for `g` and runs it once on zeros: Ok, or the first error.
/// (XNNPACK patch 0002 checks these at reshape, where internal values have their real shapes.)
fn run_once(g: &Subgraph<'_>, input_len: usize, output_len: usize) -> Result<(), String> {
    let mut runtime = Runtime::new(g, None).map_err(|e| e.to_string())?;
    let input = vec![0.0f32; input_len];
    let mut output = vec![0.0f32; output_len];
    runtime
        .invoke(&[(INPUT, &input)], &mut [(OUTPUT, &mut output)])
        .map_err(|e| e.to_string())
}

#[test]
fn operands_whose_shapes_do_not_match_the_node_are_refused_at_reshape() {
    // XNNPACK (patches/0002): a fully connected input declared [1, 131088] over a [8, 16]
    // filter made the GEMM write 8193 rows into an output of one; a convolution reads the
    // operator's channels per pixel, whatever the input holds.
    let weights = vec![0.25f32; 8 * 16];
    for (input_dims, ok) in [([1usize, 16], true), ([1, 32], false), ([2, 8], false)] {
        let mut g = Subgraph::new(2).unwrap();
        let x = g
            .define_f32_tensor(&input_dims, ValueRole::Input(INPUT))
            .unwrap();
        let f = g
            .define_f32_tensor(&[8, 16], ValueRole::static_f32(&weights))
            .unwrap();
        let y = g
            .define_f32_tensor(&[input_dims[0], 8], ValueRole::Output(OUTPUT))
            .unwrap();
        g.define_fully_connected(x, f, None, y, f32::MIN, f32::MAX)
            .unwrap();
        let ran = run_once(&g, input_dims.iter().product(), input_dims[0] * 8);
        assert_eq!(ran.is_ok(), ok, "input {input_dims:?}: {ran:?}");
    }

    let filter = vec![0.5f32; 4 * 3 * 3 * 3];
    let depthwise = vec![0.5f32; 3 * 3 * 3];
    for (channels, ok) in [(3usize, true), (2, false)] {
        let mut g = Subgraph::new(2).unwrap();
        let x = g
            .define_f32_tensor(&[1, 5, 5, channels], ValueRole::Input(INPUT))
            .unwrap();
        let f = g
            .define_f32_tensor(&[4, 3, 3, 3], ValueRole::static_f32(&filter))
            .unwrap();
        let y = g
            .define_f32_tensor(&[1, 3, 3, 4], ValueRole::Output(OUTPUT))
            .unwrap();
        g.define_convolution_2d(&Convolution2dParams::new(3, 3, 3, 4), x, f, None, y)
            .unwrap();
        let ran = run_once(&g, 25 * channels, 36);
        assert_eq!(
            ran.is_ok(),
            ok,
            "convolution over {channels} channels: {ran:?}"
        );

        let mut g = Subgraph::new(2).unwrap();
        let x = g
            .define_f32_tensor(&[1, 5, 5, channels], ValueRole::Input(INPUT))
            .unwrap();
        let f = g
            .define_f32_tensor(&[1, 3, 3, 3], ValueRole::static_f32(&depthwise))
            .unwrap();
        let y = g
            .define_f32_tensor(&[1, 3, 3, 3], ValueRole::Output(OUTPUT))
            .unwrap();
        let p = DepthwiseConvolution2dParams::new(3, 3, 3, 1);
        g.define_depthwise_convolution_2d(&p, x, f, None, y)
            .unwrap();
        let ran = run_once(&g, 25 * channels, 27);
        assert_eq!(
            ran.is_ok(),
            ok,
            "depthwise over {channels} channels: {ran:?}"
        );
    }
}

#[test]
fn an_external_id_defined_twice_is_refused() {
    // An output given its input's external id: XNNPACK keeps both in the id's one slot, so the
    // graph's output would be written into the caller's input.
    let mut g = Subgraph::new(2).unwrap();
    g.define_f32_tensor(&[1, 8], ValueRole::Input(INPUT))
        .unwrap();
    assert!(
        g.define_f32_tensor(&[1, 8], ValueRole::Output(INPUT))
            .is_err()
    );
    assert!(
        g.define_f32_tensor(&[1, 8], ValueRole::Input(INPUT))
            .is_err()
    );
    g.define_f32_tensor(&[1, 8], ValueRole::Output(OUTPUT))
        .unwrap();
    assert!(
        g.define_f32_tensor(&[1, 8], ValueRole::Output(OUTPUT))
            .is_err()
    );
}

#[test]
fn keys_in_an_empty_segment_region_past_the_end_of_the_file_read_as_empty() {
    // A .ptd whose segment region is empty may start past the end of the file; its empty
    // segments did too, and `get_data` on their keys panicked ("validated index entries lie
    // inside the backing").
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus/ptd/regression-empty-segments-past-the-end.ptd");
    let bytes = std::fs::read(path).unwrap();
    let map = FileDataMap::from_bytes(&bytes, Some(FileKind::Ptd), "regression").unwrap();
    assert!(map.num_keys() > 0);
    for i in 0..map.num_keys() {
        let key = map.key_at(i).unwrap();
        assert!(map.get_data(key).unwrap().is_empty());
    }
    for e in map.entries() {
        assert!(e.offset + e.size <= bytes.len());
    }
}

#[test]
fn concatenation_inputs_that_differ_off_the_axis_are_refused_at_reshape() {
    // A fuzzed payload concatenated [3, 8] and [1, 264] along axis 0: XNNPACK sized the output
    // from the first input and copied 264 floats per row of the second into it.
    let rows = [0.5f32; 3 * 8];
    for (second, ok) in [([1usize, 8], true), ([1, 264], false), ([1, 4], false)] {
        let mut g = Subgraph::new(2).unwrap();
        let a = g
            .define_f32_tensor(&[3, 8], ValueRole::static_f32(&rows))
            .unwrap();
        let b = g
            .define_f32_tensor(&second, ValueRole::Input(INPUT))
            .unwrap();
        let y = g
            .define_f32_tensor(&[4, 8], ValueRole::Output(OUTPUT))
            .unwrap();
        g.define_concatenate2(0, a, b, y).unwrap();
        let ran = run_once(&g, second.iter().product(), 4 * 8);
        assert_eq!(ran.is_ok(), ok, "[3, 8] and {second:?}: {ran:?}");
    }
}

#[test]
fn a_transpose_of_an_input_of_another_rank_than_its_permutation_is_refused_at_reshape() {
    // The internal value is declared [2, 2, 2], but the reshape writing it makes it [8]: its
    // permutation's rank was checked against the declaration only.
    let mut g = Subgraph::new(2).unwrap();
    let x = g
        .define_f32_tensor(&[2, 4], ValueRole::Input(INPUT))
        .unwrap();
    let flat = g
        .define_f32_tensor(&[2, 2, 2], ValueRole::Internal)
        .unwrap();
    let y = g
        .define_f32_tensor(&[2, 2, 2], ValueRole::Output(OUTPUT))
        .unwrap();
    g.define_static_reshape(&[8], x, flat).unwrap();
    g.define_static_transpose(&[2, 1, 0], flat, y).unwrap();
    assert!(run_once(&g, 8, 8).is_err());
}

#[test]
fn an_inline_delegate_payload_without_data_is_an_error() {
    // The plan reader took an entry without data (an empty slice from outside the file) as a
    // view of the file: computing its offset overflowed (a panic with overflow checks).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus/plan/regression-inline-payload-without-data.pte");
    let backend = Backend::with_defaults().unwrap();
    let none: [&std::path::Path; 0] = [];
    let program = xnnblob::program::Program::load(
        &backend,
        &path,
        &none,
        Some(&WeightsCacheChoice::Disabled),
    )
    .unwrap();
    let names: Vec<String> = program
        .method_names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert!(!names.is_empty());
    for name in names {
        assert!(program.method(&name).is_err(), "{name}");
    }
}

#[test]
fn a_slice_of_more_dimensions_than_xnnpack_holds_is_refused() {
    // A payload's slice offsets and sizes pointed at a 16-entry vector: XNNPACK copied 16 of
    // each into its node's arrays of 6, over the node's input and output ids.
    let mut g = Subgraph::new(2).unwrap();
    let x = g
        .define_f32_tensor(&[2, 4], ValueRole::Input(INPUT))
        .unwrap();
    let y = g
        .define_f32_tensor(&[2, 2], ValueRole::Output(OUTPUT))
        .unwrap();
    assert!(g.define_static_slice(&[0; 16], &[2; 16], x, y).is_err());
    assert!(g.define_static_slice(&[], &[], x, y).is_err());
    g.define_static_slice(&[0, 1], &[2, 2], x, y)
        .expect("a slice of the input's rank");
}
