// Which fp16 operators this XNNPACK creates on the CPU it runs on, against XNNPACK alone: each
// is created (packing nothing large) and deleted, and its status printed. On an Armv8.0 core
// without fp16 arithmetic (QEMU_CPU=cortex-a53) fully connected, softmax, pooling, bilinear
// resize and reductions fail with xnn_status_unsupported_hardware, while element-wise add,
// sigmoid and tanh are created (their kernels convert to fp32); with fp16 arithmetic
// (QEMU_CPU=neoverse-n1) every one is created. This is why xnnblob computes a whole fp16 graph as
// fp32 where XNNPACK has no fp16 GEMMs (src/delegate/fallback.rs), not only its GEMM nodes.
//
// Built and run by run.sh (`run.sh --target aarch64-unknown-linux-gnu f16_operators`). Exits 1
// when an operator fails for another reason than unsupported hardware.

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <xnnpack.h>

static int failures = 0;

static void report(const char* name, enum xnn_status status, xnn_operator_t op) {
  const char* said = "created";
  if (status == xnn_status_unsupported_hardware) {
    said = "unsupported hardware";
  } else if (status != xnn_status_success) {
    said = "FAILED (another status)";
    failures++;
  }
  printf("%-24s %s\n", name, said);
  if (op != NULL) {
    xnn_delete_operator(op);
  }
}

int main(void) {
  if (xnn_initialize(NULL) != xnn_status_success) {
    fprintf(stderr, "xnn_initialize failed\n");
    return 1;
  }
  xnn_operator_t op = NULL;
  // fp16 1.0 and room for XNNPACK's over-read.
  uint16_t weight[1 + XNN_EXTRA_BYTES / 2] = {0x3c00};
  report("fully connected",
         xnn_create_fully_connected_nc_f16(1, 1, 1, 1, weight, NULL, -INFINITY, INFINITY, 0, NULL,
                                           NULL, &op),
         op);
  op = NULL;
  report("softmax", xnn_create_softmax_nc_f16(0, &op), op);
  op = NULL;
  report("max pooling",
         xnn_create_max_pooling2d_nhwc_f16(0, 0, 0, 0, 2, 2, 2, 2, 1, 1, -INFINITY, INFINITY, 0,
                                           &op),
         op);
  op = NULL;
  report("average pooling",
         xnn_create_average_pooling2d_nhwc_f16(0, 0, 0, 0, 2, 2, 2, 2, -INFINITY, INFINITY, 0,
                                               &op),
         op);
  op = NULL;
  report("bilinear resize", xnn_create_resize_bilinear2d_nhwc_f16(4, 4, 0, &op), op);
  op = NULL;
  report("mean", xnn_create_reduce_nd(xnn_reduce_mean, xnn_datatype_fp16, NULL, NULL, 0, &op), op);
  op = NULL;
  report("sum", xnn_create_reduce_nd(xnn_reduce_sum, xnn_datatype_fp16, NULL, NULL, 0, &op), op);
  op = NULL;
  report("add",
         xnn_create_binary_elementwise_nd(xnn_binary_add, xnn_datatype_fp16, NULL, NULL, NULL, 0,
                                          &op),
         op);
  op = NULL;
  report("sigmoid",
         xnn_create_unary_elementwise_nc(xnn_unary_sigmoid, xnn_datatype_fp16, xnn_datatype_fp16,
                                         NULL, NULL, NULL, 0, &op),
         op);
  op = NULL;
  report("tanh",
         xnn_create_unary_elementwise_nc(xnn_unary_tanh, xnn_datatype_fp16, xnn_datatype_fp16, NULL,
                                         NULL, NULL, 0, &op),
         op);
  return failures == 0 ? 0 : 1;
}
