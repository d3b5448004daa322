//! Convolutions: 2-D (grouped, strided, dilated, clamped, narrow) and depthwise, against a
//! naive reference.

use super::*;

/// The output extent of a convolution along one axis.
fn conv_out(
    size: usize,
    pad_before: u32,
    pad_after: u32,
    kernel: u32,
    stride: u32,
    dilation: u32,
) -> usize {
    let padded = size + pad_before as usize + pad_after as usize;
    let effective = (kernel as usize - 1) * dilation as usize + 1;
    (padded - effective) / stride as usize + 1
}

/// A naive NHWC convolution; filter [groups * goc, kh, kw, gic].
fn reference_convolution(
    x: &[f32],
    [n, h, w]: [usize; 3],
    filter: &[f32],
    bias: &[f32],
    p: &Convolution2dParams,
) -> (Vec<f32>, [usize; 4]) {
    let (groups, gic, goc) = (
        p.groups as usize,
        p.group_input_channels,
        p.group_output_channels,
    );
    let (kh, kw) = (p.kernel_height as usize, p.kernel_width as usize);
    let (cin, cout) = (groups * gic, groups * goc);
    let oh = conv_out(
        h,
        p.padding.top,
        p.padding.bottom,
        p.kernel_height,
        p.stride_height,
        p.dilation_height,
    );
    let ow = conv_out(
        w,
        p.padding.left,
        p.padding.right,
        p.kernel_width,
        p.stride_width,
        p.dilation_width,
    );
    let mut y = vec![0f32; n * oh * ow * cout];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for g in 0..groups {
                    for oc in 0..goc {
                        let co = g * goc + oc;
                        let mut acc = bias[co];
                        for ky in 0..kh {
                            let iy = (oy * p.stride_height as usize
                                + ky * p.dilation_height as usize)
                                as isize
                                - p.padding.top as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for kx in 0..kw {
                                let ix = (ox * p.stride_width as usize
                                    + kx * p.dilation_width as usize)
                                    as isize
                                    - p.padding.left as isize;
                                if ix < 0 || ix >= w as isize {
                                    continue;
                                }
                                let (iy, ix) = (iy as usize, ix as usize);
                                for ic in 0..gic {
                                    let xv = x[((b * h + iy) * w + ix) * cin + g * gic + ic];
                                    let fv = filter[((co * kh + ky) * kw + kx) * gic + ic];
                                    acc += xv * fv;
                                }
                            }
                        }
                        y[((b * oh + oy) * ow + ox) * cout + co] =
                            acc.clamp(p.output_min, p.output_max);
                    }
                }
            }
        }
    }
    (y, [n, oh, ow, cout])
}

fn check_convolution(input_shape: [usize; 3], params: &Convolution2dParams, seed: u64) {
    check_convolution_within(input_shape, params, seed, 1e-4);
}

/// As [`check_convolution`], to `tolerance`: sums of thousands of products differ from the
/// reference's by more than a few ulps in another order.
fn check_convolution_within(
    input_shape: [usize; 3],
    params: &Convolution2dParams,
    seed: u64,
    tolerance: f32,
) {
    let [n, h, w] = input_shape;
    let p = params;
    let cin = p.groups as usize * p.group_input_channels;
    let cout = p.groups as usize * p.group_output_channels;
    let filter_dims = [
        cout,
        p.kernel_height as usize,
        p.kernel_width as usize,
        p.group_input_channels,
    ];
    let filter_len: usize = filter_dims.iter().product();
    let mut rng = SplitMix64(seed);
    let x = random(&mut rng, n * h * w * cin, 1.0);
    let filter = padded(random(&mut rng, filter_len, 0.4));
    let filter = &filter[..filter_len];
    let bias = padded(random(&mut rng, cout, 0.3));
    let bias = &bias[..cout];
    let (expected, out_dims) = reference_convolution(&x, input_shape, filter, bias, p);

    let mut g = Subgraph::new(2).unwrap();
    let input = g
        .define_f32_tensor(&[n, h, w, cin], ValueRole::Input(INPUT))
        .unwrap();
    let f = g
        .define_f32_tensor(&filter_dims, ValueRole::static_f32(filter))
        .unwrap();
    let b = g
        .define_f32_tensor(&[cout], ValueRole::static_f32(bias))
        .unwrap();
    let output = g
        .define_f32_tensor(&out_dims, ValueRole::Output(OUTPUT))
        .unwrap();
    g.define_convolution_2d(p, input, f, Some(b), output)
        .unwrap();
    let actual = run(&g, &x, expected.len());
    assert_close(&actual, &expected, tolerance);
}

#[test]
fn convolution_2d_3x3_same_padding_matches_naive_reference() {
    // 1x8x8x3 input, 3x3 kernel, 16 output channels, padding 1, stride 1: output 1x8x8x16.
    let mut p = Convolution2dParams::new(3, 3, 3, 16);
    p.padding = Padding2d::uniform(1);
    check_convolution([1, 8, 8], &p, 21);
}

#[test]
fn convolution_2d_grouped_strided_dilated_clamped_matches_naive_reference() {
    // Two groups of 2 -> 3 channels, stride 2, dilation 2 along the height, uneven padding,
    // and a clamp that bites: every parameter of the struct reaches XNNPACK in its place.
    let mut p = Convolution2dParams::new(3, 2, 2, 3);
    p.groups = 2;
    p.stride_height = 2;
    p.stride_width = 2;
    p.dilation_height = 2;
    p.padding = Padding2d {
        top: 2,
        right: 1,
        bottom: 1,
        left: 0,
    };
    p.output_min = -0.6;
    p.output_max = 0.7;
    check_convolution([2, 9, 7], &p, 22);
}

/// Narrow convolutions run on narrower kernels than the default configuration's tile (patch
/// 0024: at most 2 output channels per group on the nr2 configuration, at most 8 on the nr8 one
/// of x86 CPUs with FMA3; patch 0029: with AVX512F, 16-wide where that pads less than 32): every
/// channel count from 1 to 17, and 24, 33 and 48, 3x3 (indirect GEMM) and 1x1 (GEMM), alone and
/// in groups, over 15 pixels (three 4-row tiles and a remainder of 3).
#[test]
fn narrow_convolutions_match_reference_at_every_output_channel_count() {
    for cout in (1..=17).chain([24, 33, 48]) {
        for (kernel, padding) in [(3, 1), (1, 0)] {
            let mut p = Convolution2dParams::new(kernel, kernel, 5, cout);
            p.padding = Padding2d::uniform(padding);
            check_convolution([1, 3, 5], &p, 100 + cout as u64);
            p.groups = 3;
            p.group_input_channels = 2;
            check_convolution([1, 3, 5], &p, 200 + cout as u64);
        }
    }
}

/// Convolutions whose packed weights outgrow half of an L2 of up to 18 MiB run in blocks of
/// output channels, outermost (patch 0033): 3x3 (indirect GEMM) over 512 input channels and 1x1
/// (GEMM) over 4096, each to 600 output channels (10-11 MiB of weights: several blocks and a last
/// one cut short), over 20 pixels (more than one tile of rows on every CPU class). And widths
/// where 32-wide AVX-512 tiles pad less than a quarter, which convolutions keep (patch 0034): the
/// outputs are checked, not which configuration computed them.
#[test]
fn convolutions_whose_weights_outgrow_the_l2_match_reference() {
    for (kernel, padding, cin) in [(3, 1, 512), (1, 0, 4096)] {
        let mut p = Convolution2dParams::new(kernel, kernel, cin, 600);
        p.padding = Padding2d::uniform(padding);
        check_convolution_within([1, 4, 5], &p, 300 + cin as u64, 2e-3);
    }
    for cout in [80, 112, 240] {
        let mut p = Convolution2dParams::new(3, 3, 24, cout);
        p.padding = Padding2d::uniform(1);
        check_convolution([1, 3, 5], &p, 400 + cout as u64);
    }
}

#[test]
fn depthwise_convolution_2d_matches_naive_reference() {
    let (n, h, w, c) = (2, 6, 7, 4);
    let mut p = DepthwiseConvolution2dParams::new(3, 3, c, 2);
    p.padding = Padding2d::uniform(1);
    p.stride_height = 2;
    p.stride_width = 2;
    let dm = p.depth_multiplier as usize;
    let cout = c * dm;
    let (kh, kw) = (3, 3);
    let oh = conv_out(h, 1, 1, 3, 2, 1);
    let ow = conv_out(w, 1, 1, 3, 2, 1);
    assert_eq!((oh, ow), (3, 4));

    let mut rng = SplitMix64(31);
    let x = random(&mut rng, n * h * w * c, 1.0);
    let filter = padded(random(&mut rng, kh * kw * cout, 0.5));
    let filter = &filter[..kh * kw * cout];
    let bias = padded(random(&mut rng, cout, 0.3));
    let bias = &bias[..cout];

    // Output channel c * dm + m reads input channel c through filter[0, ky, kx, c * dm + m].
    let mut expected = vec![0f32; n * oh * ow * cout];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for co in 0..cout {
                    let ci = co / dm;
                    let mut acc = bias[co];
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let iy = (oy * 2 + ky) as isize - 1;
                            let ix = (ox * 2 + kx) as isize - 1;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            let (iy, ix) = (iy as usize, ix as usize);
                            acc += x[((b * h + iy) * w + ix) * c + ci]
                                * filter[(ky * kw + kx) * cout + co];
                        }
                    }
                    expected[((b * oh + oy) * ow + ox) * cout + co] = acc;
                }
            }
        }
    }

    let mut g = Subgraph::new(2).unwrap();
    let input = g
        .define_f32_tensor(&[n, h, w, c], ValueRole::Input(INPUT))
        .unwrap();
    let f = g
        .define_f32_tensor(&[1, kh, kw, cout], ValueRole::static_f32(filter))
        .unwrap();
    let bi = g
        .define_f32_tensor(&[cout], ValueRole::static_f32(bias))
        .unwrap();
    let output = g
        .define_f32_tensor(&[n, oh, ow, cout], ValueRole::Output(OUTPUT))
        .unwrap();
    g.define_depthwise_convolution_2d(&p, input, f, Some(bi), output)
        .unwrap();
    let actual = run(&g, &x, expected.len());
    assert_close(&actual, &expected, 1e-4);
}
