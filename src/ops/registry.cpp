// The kernel table. One row per (domain, op type, range of op versions); read it top to bottom
// to see what onnxtrain runs. An op's version is the one ONNX's operator versioning gives the
// node: the newest since_version of the op's schema at the opset the model imports for the
// node's domain (Add in a model of opset 15 is Add-14). Where an op's semantics changed (an
// attribute became an input, a default changed), the rows split at that version and the
// factory reads init.opset() to pick the behaviour.
#include "ops/registry.h"

#include <onnx/defs/schema.h>

#include "ops/factories.h"

namespace onnxtrain::ops {

namespace {

constexpr int kMaxOnnx = 28;  // the newest ai.onnx opset ONNX 1.23 defines
// Rows written against ONNX 1.12 serve every op version up to opset 17. A newer version of an
// op needs a row (or a wider range) of its own, so that a change of semantics in a later
// opset cannot reach a kernel written before it.
constexpr int kOnnx17 = 17;

constexpr std::string_view kTraining = "ai.onnx.preview.training";
// onnxtrain's own ops, emitted by gradient rules (docs/gradients.md) and by the runtime's
// fusions (runtime/fusion.h); every model gets version 1 of this domain implicitly.
constexpr std::string_view kInternal = "ai.onnxtrain";

constexpr OpsetRange kOpsets[] = {
    {"", 1, kMaxOnnx},
    {kTraining, 1, 1},
    {kInternal, 1, 1},
};

constexpr DTypeSet kFloat32And64{DataType::Float32, DataType::Float64};

// clang-format off
const KernelDef kKernels[] = {
  // domain, op type,          since, until (op versions), input types, factory, type input
  // --- element-wise math (elementwise_unary.cpp) ---
  {"", "Abs",                   1, kOnnx17, kNumeric,          make_unary},
  {"", "Neg",                   1, kOnnx17, kSignedNumeric,    make_unary},
  {"", "Sqrt",                  1, kOnnx17, kFloat,            make_unary},
  {"", "Reciprocal",            1, kOnnx17, kFloat,            make_unary},
  {"", "Exp",                   1, kOnnx17, kFloat,            make_unary},
  {"", "Log",                   1, kOnnx17, kFloat,            make_unary},
  {"", "Erf",                   9, kOnnx17, kFloat,            make_unary},
  {"", "Tanh",                  1, kOnnx17, kFloat,            make_unary},
  {"", "Sigmoid",               1, kOnnx17, kFloat,            make_unary},
  {"", "Relu",                  1, kOnnx17, kSignedNumeric,    make_unary},
  {"", "Softplus",              1, kOnnx17, kFloat,            make_unary},
  {"", "Softsign",              1, kOnnx17, kFloat,            make_unary},
  {"", "HardSwish",            14, kOnnx17, kFloat,            make_unary},
  {"", "Sin",                   7, kOnnx17, kFloat,            make_unary},
  {"", "Cos",                   7, kOnnx17, kFloat,            make_unary},
  {"", "Tan",                   7, kOnnx17, kFloat,            make_unary},
  {"", "Asin",                  7, kOnnx17, kFloat,            make_unary},
  {"", "Acos",                  7, kOnnx17, kFloat,            make_unary},
  {"", "Atan",                  7, kOnnx17, kFloat,            make_unary},
  {"", "Sinh",                  9, kOnnx17, kFloat,            make_unary},
  {"", "Cosh",                  9, kOnnx17, kFloat,            make_unary},
  {"", "Asinh",                 9, kOnnx17, kFloat,            make_unary},
  {"", "Acosh",                 9, kOnnx17, kFloat,            make_unary},
  {"", "Atanh",                 9, kOnnx17, kFloat,            make_unary},
  {"", "Floor",                 1, kOnnx17, kFloat,            make_unary},
  {"", "Ceil",                  1, kOnnx17, kFloat,            make_unary},
  {"", "Round",                11, kOnnx17, kFloat,            make_unary},
  {"", "Sign",                  9, kOnnx17, kNumeric,          make_unary},
  {"", "Not",                   1, kOnnx17, kBool,             make_unary},
  {"", "IsNaN",                 9, kOnnx17, kFloat,            make_unary},
  {"", "IsInf",                10, kOnnx17, kFloat,            make_activation},
  {"", "LeakyRelu",             1, kOnnx17, kFloat,            make_activation},
  {"", "Elu",                   1, kOnnx17, kFloat,            make_activation},
  {"", "Selu",                  1, kOnnx17, kFloat,            make_activation},
  {"", "Celu",                 12, kOnnx17, kFloat,            make_activation},
  {"", "HardSigmoid",           1, kOnnx17, kFloat,            make_activation},
  {"", "ThresholdedRelu",      10, kOnnx17, kFloat,            make_activation},
  {"", "Shrink",                9, kOnnx17, kNumeric,          make_activation},
  {"", "Clip",                  1, 10,       kFloat,            make_clip},  // min/max attributes
  {"", "Clip",                 11, kOnnx17, kNumeric,          make_clip},  // min/max inputs
  {"", "Cast",                  1, kOnnx17, kAll,              make_cast},
  {"", "CastLike",             15, kOnnx17, kAll,              make_cast_like},
  {"", "Identity",              1, kOnnx17, kAll,              make_identity},

  // --- broadcasting binary and variadic ops (elementwise_binary.cpp) ---
  // Before opset 7 these broadcast only with the `broadcast`/`axis` attributes.
  {"", "Add",                   1, 6,        kNumeric,          make_binary},
  {"", "Add",                   7, kOnnx17, kNumeric,          make_binary},
  {"", "Sub",                   1, 6,        kNumeric,          make_binary},
  {"", "Sub",                   7, kOnnx17, kNumeric,          make_binary},
  {"", "Mul",                   1, 6,        kNumeric,          make_binary},
  {"", "Mul",                   7, kOnnx17, kNumeric,          make_binary},
  {"", "Div",                   1, 6,        kNumeric,          make_binary},
  {"", "Div",                   7, kOnnx17, kNumeric,          make_binary},
  {"", "Pow",                   1, 6,        kFloat,            make_binary},
  {"", "Pow",                   7, kOnnx17, kNumeric,          make_binary},
  {"", "Mod",                  10, kOnnx17, kNumeric,          make_binary},
  {"", "PRelu",                 1, kOnnx17, kNumeric,          make_binary},
  {"", "Equal",                 1, 6,        kAll,              make_binary},
  {"", "Equal",                 7, kOnnx17, kAll,              make_binary},
  {"", "Greater",               1, 6,        kNumeric,          make_binary},
  {"", "Greater",               7, kOnnx17, kNumeric,          make_binary},
  {"", "Less",                  1, 6,        kNumeric,          make_binary},
  {"", "Less",                  7, kOnnx17, kNumeric,          make_binary},
  {"", "GreaterOrEqual",       12, kOnnx17, kNumeric,          make_binary},
  {"", "LessOrEqual",          12, kOnnx17, kNumeric,          make_binary},
  {"", "And",                   1, 6,        kBool,             make_binary},
  {"", "And",                   7, kOnnx17, kBool,             make_binary},
  {"", "Or",                    1, 6,        kBool,             make_binary},
  {"", "Or",                    7, kOnnx17, kBool,             make_binary},
  {"", "Xor",                   1, 6,        kBool,             make_binary},
  {"", "Xor",                   7, kOnnx17, kBool,             make_binary},
  {"", "Min",                   1, kOnnx17, kNumeric,          make_variadic},
  {"", "Max",                   1, kOnnx17, kNumeric,          make_variadic},
  {"", "Sum",                   1, kOnnx17, kNumeric,          make_variadic},
  {"", "Mean",                  1, kOnnx17, kFloat,            make_variadic},
  {"", "Where",                 9, kOnnx17, kAll,              make_where, 1},

  // --- linear algebra (matmul.cpp) ---
  {"", "MatMul",                1, kOnnx17, kNumeric,          make_matmul},
  {"", "Gemm",                  1, kOnnx17, kNumeric,          make_gemm},
  {"", "Einsum",               12, kOnnx17, kNumeric,          make_einsum},  // einsum.cpp

  // --- convolution and pooling (conv.cpp, pool.cpp) ---
  {"", "Conv",                  1, kOnnx17, kFloat,            make_conv},
  {"", "ConvTranspose",         1, kOnnx17, kFloat,            make_conv_transpose},
  {"", "MaxPool",               1, kOnnx17, kFloat | kInt,     make_pool},
  {"", "AveragePool",           1, kOnnx17, kFloat,            make_pool},
  {"", "GlobalAveragePool",     1, kOnnx17, kFloat,            make_global_pool},
  {"", "GlobalMaxPool",         1, kOnnx17, kFloat,            make_global_pool},

  // --- normalization and regularization (normalization.cpp) ---
  {"", "BatchNormalization",    1, 13,       kFloat,            make_batch_norm},  // is_test/outputs
  {"", "BatchNormalization",   14, kOnnx17, kFloat,            make_batch_norm},  // training_mode
  {"", "InstanceNormalization", 1, kOnnx17, kFloat,            make_instance_norm},
  {"", "LayerNormalization",   17, kOnnx17, kFloat,            make_layer_norm},
  {"", "Dropout",               1, 11,       kFloat,            make_dropout},  // ratio attribute
  {"", "Dropout",              12, kOnnx17, kFloat,            make_dropout},  // ratio, training_mode inputs

  // --- softmax family (softmax.cpp): before opset 13 the input is coerced to 2-D at `axis` ---
  {"", "Softmax",               1, 12,       kFloat,            make_softmax},
  {"", "Softmax",              13, kOnnx17, kFloat,            make_softmax},
  {"", "LogSoftmax",            1, 12,       kFloat,            make_softmax},
  {"", "LogSoftmax",           13, kOnnx17, kFloat,            make_softmax},
  {"", "Hardmax",               1, 12,       kFloat,            make_softmax},
  {"", "Hardmax",              13, kOnnx17, kFloat,            make_softmax},

  // --- reductions (reduce.cpp): ReduceSum takes axes as an input from opset 13 ---
  {"", "ReduceSum",             1, 12,       kNumeric,          make_reduce},
  {"", "ReduceSum",            13, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceMean",            1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceMax",             1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceMin",             1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceProd",            1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceL1",              1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceL2",              1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceSumSquare",       1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceLogSum",          1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceLogSumExp",       1, kOnnx17, kNumeric,          make_reduce},
  {"", "ArgMax",                1, kOnnx17, kNumeric,          make_arg_reduce},
  {"", "ArgMin",                1, kOnnx17, kNumeric,          make_arg_reduce},
  {"", "CumSum",               11, kOnnx17, kNumeric,          make_cumsum},
  {"", "TopK",                  1, 9,        kNumeric,          make_topk},  // k attribute
  {"", "TopK",                 10, kOnnx17, kNumeric,          make_topk},  // k input

  // --- recurrent (rnn.cpp) ---
  {"", "RNN",                   7, 13,       kFloat,            make_rnn},  // no layout attribute
  {"", "RNN",                  14, kOnnx17, kFloat,            make_rnn},  // layout attribute
  {"", "GRU",                   7, 13,       kFloat,            make_rnn},  // no layout attribute
  {"", "GRU",                  14, kOnnx17, kFloat,            make_rnn},  // layout attribute
  {"", "LSTM",                  7, 13,       kFloat,            make_rnn},  // no layout attribute
  {"", "LSTM",                 14, kOnnx17, kFloat,            make_rnn},  // layout attribute

  // --- losses (loss.cpp) ---
  {"", "SoftmaxCrossEntropyLoss",   12, kOnnx17, kFloat,       make_softmax_cross_entropy_loss},
  {"", "NegativeLogLikelihoodLoss", 12, kOnnx17, kFloat,       make_nll_loss},

  // --- shape and data movement (shape_ops.cpp) ---
  {"", "Reshape",               1, 4,        kAll,              make_reshape},  // shape attribute
  {"", "Reshape",               5, kOnnx17, kAll,              make_reshape},  // shape input
  {"", "Flatten",               1, kOnnx17, kAll,              make_flatten},
  {"", "Squeeze",               1, 12,       kAll,              make_squeeze},    // axes attribute
  {"", "Squeeze",              13, kOnnx17, kAll,              make_squeeze},    // axes input
  {"", "Unsqueeze",             1, 12,       kAll,              make_unsqueeze},  // axes attribute
  {"", "Unsqueeze",            13, kOnnx17, kAll,              make_unsqueeze},  // axes input
  {"", "Transpose",             1, kOnnx17, kAll,              make_transpose},
  {"", "Concat",                1, kOnnx17, kAll,              make_concat},
  {"", "Split",                 1, 12,       kAll,              make_split},  // split attribute
  {"", "Split",                13, kOnnx17, kAll,              make_split},  // split input
  {"", "Expand",                8, kOnnx17, kAll,              make_expand},
  {"", "Tile",                  6, kOnnx17, kAll,              make_tile},
  {"", "Pad",                   1, 10,       kAll,              make_pad},  // pads/value attributes
  {"", "Pad",                  11, kOnnx17, kAll,              make_pad},  // pads/value inputs
  {"", "Shape",                 1, kOnnx17, kAll,              make_shape},
  {"", "Size",                  1, kOnnx17, kAll,              make_size},
  {"", "DepthToSpace",          1, kOnnx17, kAll,              make_depth_to_space},
  {"", "SpaceToDepth",          1, kOnnx17, kAll,              make_space_to_depth},

  // --- indexing (indexing.cpp) ---
  {"", "Slice",                 1, 9,        kAll,              make_slice},  // starts/ends attributes
  {"", "Slice",                10, kOnnx17, kAll,              make_slice},  // starts/ends inputs
  {"", "Gather",                1, kOnnx17, kAll,              make_gather},
  {"", "GatherElements",       11, kOnnx17, kAll,              make_gather_elements},
  {"", "GatherND",             11, kOnnx17, kAll,              make_gather_nd},
  {"", "Scatter",               9, 10,       kAll,              make_scatter_elements},  // ScatterElements' old name
  {"", "ScatterElements",      11, kOnnx17, kAll,              make_scatter_elements},
  {"", "ScatterND",            11, kOnnx17, kAll,              make_scatter_nd},
  {"", "OneHot",                9, kOnnx17, kNumeric,          make_one_hot},
  {"", "Trilu",                14, kOnnx17, kAll,              make_trilu},

  // --- tensor generators (generators.cpp) ---
  {"", "Constant",              1, kOnnx17, DTypeSet{},        make_constant},
  {"", "ConstantOfShape",       9, kOnnx17, kIndex,            make_constant_of_shape},
  {"", "Range",                11, kOnnx17, kNumeric,          make_range},
  {"", "EyeLike",               9, kOnnx17, kAll,              make_eye_like},

  // --- resampling (resize.cpp) ---
  {"", "Resize",               11, kOnnx17, kNumeric,          make_resize},

  // --- control flow (runtime/control_flow.cpp): If's condition is a bool; Loop checks its own ---
  {"", "If",                    1, kOnnx17, kBool,             make_if},
  {"", "Loop",                  1, kOnnx17, DTypeSet{},        make_loop},

  // --- random generators (random.cpp) ---
  {"", "RandomNormal",          1, kOnnx17, DTypeSet{},        make_random},
  {"", "RandomUniform",         1, kOnnx17, DTypeSet{},        make_random},
  {"", "RandomNormalLike",      1, kOnnx17, kAll,              make_random},
  {"", "RandomUniformLike",     1, kOnnx17, kAll,              make_random},
  {"", "Bernoulli",            15, kOnnx17, kFloat,            make_bernoulli},

  // --- image and text features (image_decoder.cpp, tfidf.cpp): not differentiable ---
  {"", "ImageDecoder",         20, kMaxOnnx, DTypeSet{DataType::UInt8}, make_image_decoder},
  {"", "TfIdfVectorizer",       9, kMaxOnnx, kIndex,           make_tfidf_vectorizer},

  // --- ai.onnx.preview.training optimizers (optimizers.cpp); the type is that of R ---
  {kTraining, "Adagrad",        1, 1,        kFloat32And64,     make_adagrad},
  {kTraining, "Momentum",       1, 1,        kFloat32And64,     make_momentum},
  {kTraining, "Adam",           1, 1,        kFloat32And64,     make_adam},

  // --- ai.onnxtrain: backward ops emitted by gradient rules (gradient_ops.cpp, conv_grad.cpp, pool_grad.cpp, rnn_grad.cpp) ---
  {kInternal, "SumToShape",         1, 1,    kNumeric,          make_sum_to_shape},
  {kInternal, "ReluGrad",           1, 1,    kFloat,            make_relu_grad},
  {kInternal, "GatherGrad",         1, 1,    kFloat,            make_gather_grad},
  {kInternal, "GatherElementsGrad", 1, 1,    kFloat,            make_gather_grad},
  {kInternal, "GatherNDGrad",       1, 1,    kFloat,            make_gather_grad},
  {kInternal, "GatherElements",     1, 1,    kAll,              make_gather_elements},  // for Scatter-9/10 gradients
  {kInternal, "ConvGrad",           1, 1,    kFloat,            make_conv_grad},
  {kInternal, "ConvTransposeGrad",  1, 1,    kFloat,            make_conv_grad},
  {kInternal, "MaxPoolGrad",        1, 1,    kFloat,            make_pool_grad},
  {kInternal, "AveragePoolGrad",    1, 1,    kFloat,            make_pool_grad},
  {kInternal, "ResizeGrad",         1, 1,    kFloat,            make_resize},  // resize.cpp
  {kInternal, "RNNGrad",            1, 1,    kFloat32And64,     make_rnn_grad},  // rnn_grad.cpp
  {kInternal, "GRUGrad",            1, 1,    kFloat32And64,     make_rnn_grad},
  {kInternal, "LSTMGrad",           1, 1,    kFloat32And64,     make_rnn_grad},
  // --- ai.onnxtrain: fused by the runtime (runtime/fusion.cpp) ---
  {kInternal, "ScaledAdam",         1, 1,    kFloat32And64,     make_scaled_adam},  // Adam between scalar Div/Mul
  {kInternal, "FusedConv",          1, 1,    kFloat,            make_fused_conv},   // Conv [-> Relu] -> MaxPool (conv.cpp)
};
// clang-format on

}  // namespace

std::string DTypeSet::to_string() const {
  std::string s;
  for (int t = 0; t <= static_cast<int>(DataType::BFloat16); ++t) {
    if (!contains(static_cast<DataType>(t))) continue;
    if (!s.empty()) s += ", ";
    s += dtype_name(static_cast<DataType>(t));
  }
  return s;
}

std::span<const KernelDef> kernel_table() { return kKernels; }
std::span<const OpsetRange> supported_opsets() { return kOpsets; }

int op_version(std::string_view domain, std::string_view op_type, int opset) {
  if (domain == kInternal) return opset;  // onnxtrain's own ops have no ONNX schema
  const onnx::OpSchema* schema =
      onnx::OpSchemaRegistry::Schema(std::string(op_type), opset, std::string(domain));
  return schema ? schema->SinceVersion() : 0;
}

const KernelDef* find_kernel(std::string_view domain, std::string_view op_type, int opset) {
  const int version = op_version(domain, op_type, opset);
  if (version == 0) return nullptr;
  for (const KernelDef& def : kKernels) {
    if (def.domain == domain && def.op_type == op_type && def.since <= version && version <= def.until) {
      return &def;
    }
  }
  return nullptr;
}

const OpsetRange* find_opset_range(std::string_view domain) {
  for (const OpsetRange& range : kOpsets) {
    if (range.domain == domain) return &range;
  }
  return nullptr;
}

}  // namespace onnxtrain::ops
