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
// Rows reviewed against ONNX 1.23 (opset 28): every version of the op up to 28 was read (schema
// doc, attributes, inputs, type constraints) and its changes implemented. Versions that only
// add element types are served by widening the row: its DTypeSet decides which types reach the
// kernel. Session/Registry.EveryOpVersionUpTo28IsServed lists what is deliberately not served.
constexpr int kOnnx28 = 28;

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
// Signal processing, bitwise and selection ops: the types of their versions before bfloat16.
constexpr DTypeSet kFloatNoBFloat16{DataType::Float32, DataType::Float64, DataType::Float16};
constexpr DTypeSet kAllNoBFloat16 = kFloatNoBFloat16 | kInt | kBool;
constexpr DTypeSet kCumProdTypes = kFloat | DTypeSet{DataType::Int32, DataType::Int64, DataType::UInt32, DataType::UInt64};
constexpr DTypeSet kFloat16And32And64{DataType::Float16, DataType::Float32, DataType::Float64};

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
  {"", "Softplus",              1, kOnnx28, kFloat,            make_unary},
  {"", "Softsign",              1, kOnnx28, kFloat,            make_unary},
  {"", "HardSwish",            14, kOnnx28, kFloat,            make_unary},
  {"", "Sin",                   7, kOnnx28, kFloat,            make_unary},
  {"", "Cos",                   7, kOnnx28, kFloat,            make_unary},
  {"", "Tan",                   7, kOnnx28, kFloat,            make_unary},
  {"", "Asin",                  7, kOnnx28, kFloat,            make_unary},
  {"", "Acos",                  7, kOnnx28, kFloat,            make_unary},
  {"", "Atan",                  7, kOnnx28, kFloat,            make_unary},
  {"", "Sinh",                  9, kOnnx28, kFloat,            make_unary},
  {"", "Cosh",                  9, kOnnx28, kFloat,            make_unary},
  {"", "Asinh",                 9, kOnnx28, kFloat,            make_unary},
  {"", "Acosh",                 9, kOnnx28, kFloat,            make_unary},
  {"", "Atanh",                 9, kOnnx28, kFloat,            make_unary},
  {"", "Floor",                 1, kOnnx17, kFloat,            make_unary},
  {"", "Ceil",                  1, kOnnx17, kFloat,            make_unary},
  {"", "Round",                11, kOnnx28, kFloat,            make_unary},
  {"", "Sign",                  9, kOnnx17, kNumeric,          make_unary},
  {"", "Not",                   1, kOnnx17, kBool,             make_unary},
  {"", "IsNaN",                 9, kOnnx28, kFloat,            make_unary},
  {"", "IsInf",                10, kOnnx28, kFloat,            make_activation},
  {"", "LeakyRelu",             1, kOnnx17, kFloat,            make_activation},
  {"", "Elu",                   1, kOnnx28, kFloat,            make_activation},
  {"", "Selu",                  1, kOnnx28, kFloat,            make_activation},
  {"", "Celu",                 12, kOnnx28, kFloat,            make_activation},
  {"", "HardSigmoid",           1, kOnnx28, kFloat,            make_activation},
  {"", "ThresholdedRelu",      10, kOnnx28, kFloat,            make_activation},
  {"", "Shrink",                9, kOnnx17, kNumeric,          make_activation},
  {"", "Clip",                  1, 10,       kFloat,            make_clip},  // min/max attributes
  {"", "Clip",                 11, kOnnx17, kNumeric,          make_clip},  // min/max inputs
  {"", "Identity",              1, kOnnx28, kAll | kString,    make_identity},

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
  {"", "Mod",                  10, kOnnx28, kNumeric,          make_binary},
  {"", "PRelu",                 1, kOnnx17, kNumeric,          make_binary},
  {"", "Equal",                 1, 6,        kAll,              make_binary},
  // Equal-19 adds string, which onnxtrain's Tensor cannot hold: a string input is refused when
  // the model loads, and the row's types exclude it. Served because gradient rules emit Equal
  // at the model's opset (Max, Min, ReduceMax, GlobalMaxPool, losses with ignore_index).
  {"", "Equal",                 7, 18,       kAll,              make_binary},
  {"", "Equal",                19, kOnnx28, kAll | kString,    make_binary},  // + string
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
  {"", "Einsum",               12, kOnnx28, kNumeric,          make_einsum},  // einsum.cpp

  // --- convolution and pooling (conv.cpp, pool.cpp) ---
  {"", "Conv",                  1, kOnnx28, kFloat,            make_conv},
  {"", "ConvTranspose",         1, kOnnx28, kFloat,            make_conv_transpose},
  {"", "MaxPool",               1, kOnnx28, kFloat | kInt,     make_pool},
  {"", "AveragePool",           1, kOnnx28, kFloat,            make_pool},
  {"", "GlobalAveragePool",     1, kOnnx28, kFloat,            make_global_pool},
  {"", "GlobalMaxPool",         1, kOnnx28, kFloat,            make_global_pool},

  // --- normalization and regularization (normalization.cpp) ---
  {"", "BatchNormalization",    1, 13,       kFloat,            make_batch_norm},  // is_test/outputs
  {"", "BatchNormalization",   14, kOnnx17, kFloat,            make_batch_norm},  // training_mode
  {"", "InstanceNormalization", 1, kOnnx28, kFloat,            make_instance_norm},
  {"", "LayerNormalization",   17, kOnnx17, kFloat,            make_layer_norm},
  {"", "Dropout",               1, 11,       kFloat,            make_dropout},  // ratio attribute
  {"", "Dropout",              12, kOnnx28, kFloat,            make_dropout},  // ratio, training_mode inputs

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
  // The other reductions take axes as an input (and noop_with_empty_axes) from opset 18;
  // ReduceMax/ReduceMin add bool at 20; ReduceLogSum/ReduceLogSumExp-28 drop the integer types.
  {"", "ReduceMean",            1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceMean",           18, kOnnx28, kNumeric,          make_reduce},
  {"", "ReduceMax",             1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceMax",            18, 19,       kNumeric,          make_reduce},
  {"", "ReduceMax",            20, kOnnx28, kNumeric | kBool,  make_reduce},
  {"", "ReduceMin",             1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceMin",            18, 19,       kNumeric,          make_reduce},
  {"", "ReduceMin",            20, kOnnx28, kNumeric | kBool,  make_reduce},
  {"", "ReduceProd",            1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceProd",           18, kOnnx28, kNumeric,          make_reduce},
  {"", "ReduceL1",              1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceL1",             18, kOnnx28, kNumeric,          make_reduce},
  {"", "ReduceL2",              1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceL2",             18, kOnnx28, kNumeric,          make_reduce},
  {"", "ReduceSumSquare",       1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceSumSquare",      18, kOnnx28, kNumeric,          make_reduce},
  {"", "ReduceLogSum",          1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceLogSum",         18, 18,       kNumeric,          make_reduce},
  {"", "ReduceLogSum",         28, kOnnx28, kFloat,            make_reduce},
  {"", "ReduceLogSumExp",       1, kOnnx17, kNumeric,          make_reduce},
  {"", "ReduceLogSumExp",      18, 18,       kNumeric,          make_reduce},
  {"", "ReduceLogSumExp",      28, kOnnx28, kFloat,            make_reduce},
  {"", "ArgMax",                1, kOnnx17, kNumeric,          make_arg_reduce},
  {"", "ArgMin",                1, kOnnx17, kNumeric,          make_arg_reduce},
  {"", "CumSum",               11, kOnnx17, kNumeric,          make_cumsum},
  {"", "TopK",                  1, 9,        kNumeric,          make_topk},  // k attribute
  {"", "TopK",                 10, kOnnx28, kNumeric,          make_topk},  // k input

  // --- recurrent (rnn.cpp) ---
  {"", "RNN",                   7, 13,       kFloat,            make_rnn},  // no layout attribute
  {"", "RNN",                  14, kOnnx28, kFloat,            make_rnn},  // layout attribute
  {"", "GRU",                   7, 13,       kFloat,            make_rnn},  // no layout attribute
  {"", "GRU",                  14, kOnnx28, kFloat,            make_rnn},  // layout attribute
  {"", "LSTM",                  7, 13,       kFloat,            make_rnn},  // no layout attribute
  {"", "LSTM",                 14, kOnnx28, kFloat,            make_rnn},  // layout attribute

  // --- losses (loss.cpp) ---
  {"", "SoftmaxCrossEntropyLoss",   12, kOnnx17, kFloat,       make_softmax_cross_entropy_loss},
  {"", "NegativeLogLikelihoodLoss", 12, kOnnx28, kFloat,       make_nll_loss},

  // --- shape and data movement (shape_ops.cpp) ---
  {"", "Reshape",               1, 4,        kAll,              make_reshape},  // shape attribute
  {"", "Reshape",               5, kOnnx28, kAll,              make_reshape},  // shape input
  {"", "Flatten",               1, kOnnx28, kAll,              make_flatten},
  {"", "Squeeze",               1, 12,       kAll,              make_squeeze},    // axes attribute
  {"", "Squeeze",              13, kOnnx28, kAll,              make_squeeze},    // axes input
  {"", "Unsqueeze",             1, 12,       kAll,              make_unsqueeze},  // axes attribute
  {"", "Unsqueeze",            13, kOnnx28, kAll,              make_unsqueeze},  // axes input
  {"", "Transpose",             1, kOnnx28, kAll,              make_transpose},
  {"", "Concat",                1, kOnnx17, kAll,              make_concat},
  {"", "Split",                 1, 12,       kAll,              make_split},  // split attribute
  {"", "Split",                13, kOnnx17, kAll,              make_split},  // split input
  {"", "Split",                18, kOnnx28, kAll,              make_split},  // num_outputs attribute
  {"", "Expand",                8, kOnnx17, kAll,              make_expand},
  {"", "Tile",                  6, kOnnx17, kAll,              make_tile},
  {"", "Pad",                   1, 10,       kAll,              make_pad},  // pads/value attributes
  {"", "Pad",                  11, kOnnx17, kAll,              make_pad},  // pads/value inputs
  {"", "Pad",                  18, 18,       kAll,              make_pad},  // axes input
  {"", "Pad",                  19, kOnnx28, kAll,              make_pad},  // wrap mode
  {"", "Shape",                 1, kOnnx28, kAll,              make_shape},
  {"", "Size",                  1, kOnnx28, kAll,              make_size},
  {"", "DepthToSpace",          1, kOnnx28, kAll,              make_depth_to_space},
  {"", "SpaceToDepth",          1, kOnnx28, kAll,              make_space_to_depth},

  // --- indexing (indexing.cpp) ---
  {"", "Slice",                 1, 9,        kAll,              make_slice},  // starts/ends attributes
  {"", "Slice",                10, kOnnx17, kAll,              make_slice},  // starts/ends inputs
  {"", "Gather",                1, kOnnx17, kAll,              make_gather},
  {"", "GatherElements",       11, kOnnx17, kAll,              make_gather_elements},
  {"", "GatherND",             11, kOnnx17, kAll,              make_gather_nd},
  {"", "Scatter",               9, 10,       kAll,              make_scatter_elements},  // ScatterElements' old name
  {"", "ScatterElements",      11, kOnnx17, kAll,              make_scatter_elements},
  {"", "ScatterElements",      18, kOnnx28, kAll,              make_scatter_elements},  // reduction max/min
  {"", "ScatterND",            11, kOnnx17, kAll,              make_scatter_nd},
  {"", "ScatterND",            18, kOnnx28, kAll,              make_scatter_nd},  // reduction max/min
  {"", "OneHot",                9, kOnnx28, kNumeric,          make_one_hot},
  {"", "Trilu",                14, kOnnx17, kAll,              make_trilu},

  // --- tensor generators (generators.cpp) ---
  {"", "Constant",              1, kOnnx28, DTypeSet{},        make_constant},
  {"", "ConstantOfShape",       9, kOnnx28, kIndex,            make_constant_of_shape},
  {"", "Range",                11, kOnnx17, kNumeric,          make_range},
  {"", "Range",                27, kOnnx28, kNumeric,          make_range},  // stash_type
  {"", "EyeLike",               9, kOnnx28, kAll,              make_eye_like},

  // --- resampling (resize.cpp) ---
  {"", "Resize",               11, kOnnx17, kNumeric,          make_resize},
  {"", "Resize",               18, 18,       kNumeric,          make_resize},  // antialias, axes, keep_aspect_ratio_policy
  {"", "Resize",               19, kOnnx28, kNumeric,          make_resize},  // half_pixel_symmetric

  // --- control flow (runtime/control_flow.cpp): If's condition is a bool; Loop checks its own ---
  {"", "If",                    1, kOnnx28, kBool,             make_if},
  {"", "Loop",                  1, kOnnx28, DTypeSet{},        make_loop},
  {"", "Scan",                  8, kOnnx28, DTypeSet{},        make_scan},
  {"", "SequenceMap",          17, kOnnx28, DTypeSet{},        make_sequence_map},

  // --- sequences and optionals (sequence.cpp); their inputs are sequences or optionals, so
  // the element types are checked by the kernels ---
  {"", "SequenceEmpty",        11, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "SequenceConstruct",    11, kOnnx28, kAll,              make_sequence_op},
  {"", "SequenceInsert",       11, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "SequenceAt",           11, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "SequenceErase",        11, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "SequenceLength",       11, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "ConcatFromSequence",   11, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "SplitToSequence",      11, kOnnx28, kAll,              make_sequence_op},
  {"", "Optional",             15, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "OptionalHasElement",   15, kOnnx28, DTypeSet{},        make_sequence_op},
  {"", "OptionalGetElement",   15, kOnnx28, DTypeSet{},        make_sequence_op},

  // --- strings (string_ops.cpp) ---
  {"", "StringNormalizer",     10, kOnnx28, kString,           make_string_op},
  {"", "StringConcat",         20, kOnnx28, kString,           make_string_op},
  {"", "StringSplit",          20, kOnnx28, kString,           make_string_op},
  {"", "RegexFullMatch",       20, kOnnx28, kString,           make_string_op},

  // --- random generators (random.cpp) ---
  {"", "RandomNormal",          1, kOnnx28, DTypeSet{},        make_random},
  {"", "RandomUniform",         1, kOnnx28, DTypeSet{},        make_random},
  {"", "RandomNormalLike",      1, kOnnx28, kAll,              make_random},
  {"", "RandomUniformLike",     1, kOnnx28, kAll,              make_random},
  {"", "Bernoulli",            15, kOnnx28, kFloat,            make_bernoulli},

  // --- casts (cast.cpp): each version adds types (registry.h kCast19 ..) ---
  {"", "Cast",                  1, 8,        kAll,              make_cast},
  {"", "Cast",                  9, 18,       kAll | kString,    make_cast},  // + string
  {"", "Cast",                 19, 20,       kCast19 | kString, make_cast},  // + float8, saturate
  {"", "Cast",                 21, 22,       kCast21 | kString, make_cast},  // + int4, uint4
  {"", "Cast",                 23, 23,       kCast23 | kString, make_cast},  // + float4e2m1
  {"", "Cast",                 24, 24,       kCast24 | kString, make_cast},  // + float8e8m0, round_mode
  {"", "Cast",                 25, 27,       kCast25 | kString, make_cast},  // + int2, uint2
  {"", "Cast",                 28, kMaxOnnx, kCast28 | kString, make_cast},  // + float6
  {"", "CastLike",             15, 18,       kAll | kString,    make_cast_like},
  {"", "CastLike",             19, 20,       kCast19 | kString, make_cast_like},
  {"", "CastLike",             21, 22,       kCast21 | kString, make_cast_like},
  {"", "CastLike",             23, 23,       kCast23 | kString, make_cast_like},
  {"", "CastLike",             24, 24,       kCast24 | kString, make_cast_like},
  {"", "CastLike",             25, kMaxOnnx, kCast25 | kString, make_cast_like},
  {"", "BitCast",              26, kMaxOnnx, kAll | kNarrow,    make_bitcast},

  // --- quantization (quantize.cpp, quantize_matmul.cpp, quantize_conv.cpp); the type is x's ---
  {"", "QuantizeLinear",       10, 12,       kQuantizeIn10,     make_quantize_linear},  // scalar scale
  {"", "QuantizeLinear",       13, 18,       kQuantizeIn10,     make_quantize_linear},  // + axis
  {"", "QuantizeLinear",       19, 20,       kQuantizeIn19,     make_quantize_linear},  // + float8, saturate
  {"", "QuantizeLinear",       21, 22,       kQuantizeIn19,     make_quantize_linear},  // + blocks, output_dtype, int4, int16
  {"", "QuantizeLinear",       23, 23,       kQuantizeIn19,     make_quantize_linear},  // + precision, float4
  {"", "QuantizeLinear",       24, 24,       kQuantizeIn19,     make_quantize_linear},  // + float8e8m0 scale
  {"", "QuantizeLinear",       25, 27,       kQuantizeIn19,     make_quantize_linear},  // + int2
  {"", "QuantizeLinear",       28, kMaxOnnx, kQuantizeIn19,     make_quantize_linear},  // + float6
  {"", "DequantizeLinear",     10, 12,       kDequantizeIn10,   make_dequantize_linear},
  {"", "DequantizeLinear",     13, 18,       kDequantizeIn10,   make_dequantize_linear},
  {"", "DequantizeLinear",     19, 20,       kDequantizeIn19,   make_dequantize_linear},
  {"", "DequantizeLinear",     21, 22,       kDequantizeIn21,   make_dequantize_linear},
  {"", "DequantizeLinear",     23, 23,       kDequantizeIn23,   make_dequantize_linear},  // + output_dtype
  {"", "DequantizeLinear",     24, 24,       kDequantizeIn23,   make_dequantize_linear},
  {"", "DequantizeLinear",     25, 27,       kDequantizeIn25,   make_dequantize_linear},
  {"", "DequantizeLinear",     28, kMaxOnnx, kDequantizeIn28,   make_dequantize_linear},
  {"", "DynamicQuantizeLinear", 11, kMaxOnnx, DTypeSet{DataType::Float32}, make_dynamic_quantize_linear},
  {"", "MatMulInteger",        10, kMaxOnnx, kInt8Quant,        make_matmul_integer},
  {"", "QLinearMatMul",        10, 20,       kInt8Quant,        make_qlinear_matmul},
  {"", "QLinearMatMul",        21, kMaxOnnx, kInt8Quant | kFloat8, make_qlinear_matmul},  // + float8, float16 scales
  {"", "ConvInteger",          10, kMaxOnnx, kInt8Quant,        make_conv_integer},
  {"", "QLinearConv",          10, kMaxOnnx, kInt8Quant,        make_qlinear_conv},

  // --- signal processing (signal.cpp, windows.cpp), bitwise (bitwise.cpp), selection (selection.cpp,
  //     nms.cpp), determinants (linalg.cpp), CumProd (cumprod.cpp) ---
  {"", "DFT",                  17, 17,       kFloat,            make_dft},  // axis attribute
  {"", "DFT",                  20, 20,       kFloat,            make_dft},  // axis input
  {"", "STFT",                 17, 17,       kFloat,            make_stft},
  {"", "HannWindow",           17, 17,       kIndex,            make_window},
  {"", "HammingWindow",        17, 17,       kIndex,            make_window},
  {"", "BlackmanWindow",       17, 17,       kIndex,            make_window},
  {"", "MelWeightMatrix",      17, 17,       kIndex,            make_mel_weight_matrix},
  {"", "BitShift",             11, 11,       kUnsignedInt,      make_bitwise},
  {"", "BitShift",             28, 28,       kInt,              make_bitwise},  // signed types, out-of-range shifts
  {"", "BitwiseAnd",           18, 18,       kInt,              make_bitwise},
  {"", "BitwiseOr",            18, 18,       kInt,              make_bitwise},
  {"", "BitwiseXor",           18, 18,       kInt,              make_bitwise},
  {"", "BitwiseNot",           18, 18,       kInt,              make_bitwise_not},
  {"", "Unique",               11, 11,       kAllNoBFloat16,    make_unique_op},
  {"", "Unique",               28, 28,       kAll,              make_unique_op},
  {"", "NonZero",               9, 9,        kAllNoBFloat16,    make_nonzero},
  {"", "NonZero",              13, 13,       kAll,              make_nonzero},
  {"", "Compress",              9, 9,        kAllNoBFloat16,    make_compress},  // axis >= 0
  {"", "Compress",             11, 11,       kAllNoBFloat16,    make_compress},  // negative axis
  {"", "Compress",             28, 28,       kAll,              make_compress},
  {"", "ReverseSequence",      10, 10,       kAllNoBFloat16,    make_reverse_sequence},
  {"", "ReverseSequence",      28, 28,       kAll,              make_reverse_sequence},
  {"", "TensorScatter",        24, 24,       kAll,              make_tensor_scatter},
  {"", "NonMaxSuppression",    10, 11,       DTypeSet{DataType::Float32}, make_non_max_suppression},
  {"", "Det",                  11, 11,       kFloatNoBFloat16,  make_det},
  {"", "Det",                  22, 22,       kFloat,            make_det},
  {"", "CumProd",              26, 26,       kCumProdTypes,     make_cumprod},

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
  {kInternal, "SliceGrad",          1, 1,    kFloat,            make_slice_grad},  // indexing.cpp
  {kInternal, "SoftmaxGrad",        1, 1,    kFloat,            make_softmax_grad},  // softmax.cpp
  {kInternal, "LogSoftmaxGrad",     1, 1,    kFloat,            make_softmax_grad},
  {kInternal, "GatherElements",     1, 1,    kAll,              make_gather_elements},  // for Scatter-9/10 gradients
  {kInternal, "ConvGrad",           1, 1,    kFloat,            make_conv_grad},
  {kInternal, "ConvTransposeGrad",  1, 1,    kFloat,            make_conv_grad},
  {kInternal, "MaxPoolGrad",        1, 1,    kFloat,            make_pool_grad},
  {kInternal, "AveragePoolGrad",    1, 1,    kFloat,            make_pool_grad},
  {kInternal, "ResizeGrad",         1, 1,    kFloat,            make_resize},  // resize.cpp
  {kInternal, "RNNGrad",            1, 1,    kFloat32And64,     make_rnn_grad},  // rnn_grad.cpp
  {kInternal, "GRUGrad",            1, 1,    kFloat32And64,     make_rnn_grad},
  {kInternal, "LSTMGrad",           1, 1,    kFloat32And64,     make_rnn_grad},
  {kInternal, "RNNTraining",        1, 1,    kFloat,            make_rnn},  // rnn.cpp: the forward op with its trace
  {kInternal, "GRUTraining",        1, 1,    kFloat,            make_rnn},
  {kInternal, "LSTMTraining",       1, 1,    kFloat,            make_rnn},
  {kInternal, "DFTGrad",            1, 1,    kFloat,            make_dft_grad},  // signal.cpp
  {kInternal, "DetGrad",            1, 1,    kFloat,            make_det_grad},  // linalg.cpp
  // --- ai.onnxtrain: BatchNormalization over the global batch, train --sync-batch-norm (sync_batch_norm.cpp) ---
  {kInternal, "SyncBatchNormalization",     1, 1, kFloat,   make_sync_batch_norm},
  {kInternal, "SyncBatchNormalizationGrad", 1, 1, kFloat,   make_sync_batch_norm_grad},
  {kInternal, "BatchNormalizationGrad",     1, 1, kFloat,   make_batch_norm_grad},  // training mode's gradient
  {kInternal, "BatchNormalizationChannelBlocked", 1, 1, kFloat, make_batch_norm_channel_blocked},  // normalization.cpp
  // --- ai.onnxtrain: fused by the runtime (runtime/fusion.cpp) ---
  {kInternal, "ScaledAdam",         1, 1,    kFloat32And64,     make_scaled_adam},  // Adam between scalar Div/Mul
  {kInternal, "FusedConv",          1, 1,    kFloat,            make_fused_conv},   // Conv [-> Relu] -> MaxPool (conv.cpp)
  {kInternal, "ConvChannelsLast",   1, 1,    kFloat,            make_conv_channels_last},  // Conv on [N, D..., C] (conv.cpp)
  {kInternal, "MaxPoolChannelBlocked", 1, 1, DTypeSet{DataType::Float32}, make_max_pool_channel_blocked},  // MaxPool on [N, C / b, D..., b] (pool.cpp)
  {kInternal, "FusedGemm",          1, 1,    kNumeric,          make_fused_gemm},   // Gemm -> Relu (matmul.cpp)
  {kInternal, "MatMulAdd",          1, 1,    DTypeSet{DataType::Float32}, make_matmul_add},  // MatMul -> Add of a bias
  {kInternal, "MatMulTransposed",   1, 1,    kNumeric,          make_matmul_transposed},  // Transpose -> MatMul
  {kInternal, "MatMulPermuted",     1, 1,    kNumeric,          make_matmul_permuted},    // Transpose (any perm) -> MatMul

  // --- vision and neural-network ops (lrn.cpp, lp.cpp, grid_sample.cpp, roi_align.cpp, unpool.cpp,
  // deform_conv.cpp, vision.cpp); `until` is the newest version ONNX 1.23 defines ---
  {"", "LRN",                   1, 13,      kFloat,            make_lrn},
  {"", "LpPool",                1, 22,      kFloat,            make_lp},  // p float (1), int (2+); dilations, ceil_mode (18+)
  {"", "LpNormalization",       1, 22,      kFloat,            make_lp},
  {"", "MeanVarianceNormalization", 9, 13,  kFloat,            make_lp},
  {"", "GridSample",           16, 22,      kNumeric,          make_grid_sample},  // 2-D only at 16; N-D from 20
  {"", "AffineGrid",           20, 20,      kFloat,            make_grid_sample},
  {"", "RoiAlign",             10, 22,      kFloat,            make_roi_align},  // coordinate_transformation_mode from 16
  {"", "MaxUnpool",             9, 22,      kFloat,            make_max_unpool},
  {"", "DeformConv",           19, 22,      kFloat,            make_deform_conv},
  {"", "Col2Im",               18, 18,      kNumeric,          make_vision},
  {"", "CenterCropPad",        18, 18,      kAll,              make_vision},
  {"", "Upsample",              7, 9,       kAll,              make_vision},  // scales attribute (7), input (9); 10 is deprecated
  // --- ai.onnxtrain: their backward ops ---
  {kInternal, "LRNGrad",            1, 1,    kFloat,            make_lrn},
  {kInternal, "LpPoolGrad",         1, 1,    kFloat,            make_lp},
  {kInternal, "GridSampleGrad",     1, 1,    kFloat,            make_grid_sample, 1},
  {kInternal, "AffineGridGrad",     1, 1,    kFloat,            make_grid_sample},
  {kInternal, "RoiAlignGrad",       1, 1,    kFloat,            make_roi_align},
  {kInternal, "MaxUnpoolGrad",      1, 1,    kFloat,            make_max_unpool},
  {kInternal, "DeformConvGrad",     1, 1,    kFloat,            make_deform_conv},
  {kInternal, "Col2ImGrad",         1, 1,    kNumeric,          make_vision},
  // --- transformer ops (attention.cpp, transformer_norm.cpp, activation.cpp) ---
  {"", "Attention",            23, 25,       kFloat,            make_attention},  // 24: nonpad_kv_seqlen; 25: sliding window
  {"", "RotaryEmbedding",      23, 23,       kFloat,            make_rotary_embedding},  // float64 beyond the schema (gradient checks)
  {"", "RMSNormalization",     23, 23,       kFloat,            make_rms_norm},
  {"", "GroupNormalization",   18, 18,       kFloat,            make_group_norm},  // scale, bias per group
  {"", "GroupNormalization",   21, 21,       kFloat,            make_group_norm},  // per channel; stash_type
  {"", "Gelu",                 20, 20,       kFloat,            make_transformer_activation},
  {"", "Swish",                24, 24,       kFloat,            make_transformer_activation},
  {"", "Mish",                 18, 21,       kFloat16And32And64, make_transformer_activation},  // no bfloat16 before 22
  {"", "Mish",                 22, 22,       kFloat,            make_transformer_activation},
  {"", "SwiGLU",               28, 28,       kFloat,            make_swiglu},
  {"", "LinearAttention",      27, 27,       kFloat,            make_linear_attention},  // linear_attention.cpp; float64 beyond the schema
  {"", "CausalConvWithState",  27, 27,       kFloat,            make_causal_conv_with_state},  // float64 beyond the schema (gradient checks)
  {kInternal, "Attention",              1, 1, kFloat,           make_attention},  // runtime/fusion.h fuse_attention (attribute version: Attention's)
  {kInternal, "AttentionGrad",          1, 1, kFloat,           make_attention_grad, 1},
  {kInternal, "LayerNormalizationGrad", 1, 1, kFloat,           make_layer_norm_grad, 1},
  {kInternal, "AddLayerNormalization",  1, 1, kFloat,           make_add_layer_norm},  // runtime/fusion.h fuse_add_layer_norm
  {kInternal, "RMSNormalizationGrad",   1, 1, kFloat,           make_rms_norm, 1},
  {kInternal, "GroupNormalizationGrad", 1, 1, kFloat,           make_group_norm, 1},
  {kInternal, "Gelu",                   1, 1, kFloat,           make_transformer_activation},  // runtime/fusion.h fuse_gelu (opsets before 20)
  {kInternal, "GeluGrad",               1, 1, kFloat,           make_transformer_activation, 1},
  {kInternal, "SwishGrad",              1, 1, kFloat,           make_transformer_activation, 1},
  {kInternal, "MishGrad",               1, 1, kFloat,           make_transformer_activation, 1},
  {kInternal, "SwiGLUGrad",             1, 1, kFloat,           make_swiglu, 1},
  {kInternal, "CausalConvWithStateGrad", 1, 1, kFloat,          make_causal_conv_with_state_grad, 1},
  {kInternal, "LinearAttentionGrad",    1, 1, kFloat,           make_linear_attention_grad, 1},
};
// clang-format on

}  // namespace

std::string DTypeSet::to_string() const {
  std::string s;
  for (int t = 0; t <= kMaxDataType; ++t) {
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
