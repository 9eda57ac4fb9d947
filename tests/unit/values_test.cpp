// Values other than numeric tensors: sequences and optionals (the executor, the sequence and
// optional ops, Loop and SequenceMap carrying them, SequenceProto/OptionalProto files),
// string tensors and the string ops, Scan, and function inlining.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"
#include "ops/registry.h"
#include "runtime/functions.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using testing::add_node;
using testing::error_of;
using testing::attr;
using testing::f32;
using testing::i64;
using testing::typed_value;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

onnx::ModelProto model_at(int opset) {
  onnx::ModelProto m = testing::empty_model("values");
  m.mutable_opset_import(0)->set_version(opset);
  return m;
}

void sequence_value(onnx::ValueInfoProto* v, const std::string& name, int elem) {
  v->set_name(name);
  v->mutable_type()->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(elem);
}

Tensor strings(const Shape& shape, const std::vector<std::string>& values) {
  return Tensor::from_vector<std::string>(shape, values);
}

std::vector<std::string> string_values(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DataType::String);
  return {t.data<std::string>(), t.data<std::string>() + t.numel()};
}

TEST(Sequences, SplitInsertEraseAtAndConcat) {
  // x [6, 2] -> SplitToSequence(split=[1, 2, 3]) -> insert x[0:1] at the front -> erase index 2
  // -> length, element 1, and the concatenation along axis 0.
  onnx::ModelProto m = model_at(17);
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {6, 2});
  typed_value(g.add_input(), "split", onnx::TensorProto::INT64, {3});
  typed_value(g.add_input(), "head", onnx::TensorProto::FLOAT, {1, 2});
  add_node(g, "SplitToSequence", {"x", "split"}, {"s0"});
  auto* zero = g.add_initializer();
  zero->set_name("zero");
  zero->set_data_type(onnx::TensorProto::INT64);
  zero->add_int64_data(0);
  add_node(g, "SequenceInsert", {"s0", "head", "zero"}, {"s1"});
  auto* two = g.add_initializer();
  two->set_name("two");
  two->set_data_type(onnx::TensorProto::INT64);
  two->add_int64_data(2);
  add_node(g, "SequenceErase", {"s1", "two"}, {"s2"});
  add_node(g, "SequenceLength", {"s2"}, {"n"});
  auto* one = g.add_initializer();
  one->set_name("one");
  one->set_data_type(onnx::TensorProto::INT64);
  one->add_int64_data(-2);  // counted from the back: element 1 of 3
  add_node(g, "SequenceAt", {"s2", "one"}, {"e1"});
  add_node(g, "ConcatFromSequence", {"s2"}, {"joined"})->add_attribute()->CopyFrom(attr("axis", int64_t{0}));
  for (const char* out : {"n", "e1", "joined"}) g.add_output()->set_name(out);
  sequence_value(g.add_output(), "s2", onnx::TensorProto::FLOAT);

  runtime::Session session(m);
  const Tensor x = testing::iota({6, 2});
  const runtime::NamedValues out = session.run_values(
      {{"x", x}, {"split", i64({1, 2, 3})}, {"head", f32({1, 2}, {-1, -2})}});
  // s1 = [head, x[0:1], x[1:3], x[3:6]]; s2 drops x[1:3].
  EXPECT_EQ(out.at("n").tensor().data<int64_t>()[0], 3);
  testing::expect_close(out.at("e1").tensor(), f32({1, 2}, {0, 1}));
  testing::expect_close(out.at("joined").tensor(), f32({5, 2}, {-1, -2, 0, 1, 6, 7, 8, 9, 10, 11}));
  const Value& s2 = out.at("s2");
  ASSERT_TRUE(s2.is_sequence());
  EXPECT_EQ(s2.elements().size(), 3u);
  EXPECT_EQ(s2.type().to_string(), "sequence(float32)");
  // run() returns tensors only and names the output that is not one.
  const std::string e = error_of([&] { session.run({{"x", x}, {"split", i64({1, 2, 3})}, {"head", f32({1, 2}, {0, 0})}}); });
  EXPECT_TRUE(contains(e, "output 's2' is a sequence(float32) value") && contains(e, "run_values")) << e;
}

TEST(Sequences, PositionsAreCheckedAndNamed) {
  onnx::ModelProto m = model_at(17);
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "a", onnx::TensorProto::FLOAT, {2});
  typed_value(g.add_input(), "pos", onnx::TensorProto::INT64, {});
  add_node(g, "SequenceConstruct", {"a", "a"}, {"s"});
  add_node(g, "SequenceAt", {"s", "pos"}, {"y"});
  g.add_output()->set_name("y");
  runtime::Session session(m, {}, {}, "m.onnx");
  EXPECT_EQ(session.run({{"a", f32({2}, {1, 2})}, {"pos", Tensor::scalar<int64_t>(-2)}}).at("y").numel(), 2);
  const std::string e = error_of([&] { session.run({{"a", f32({2}, {1, 2})}, {"pos", Tensor::scalar<int64_t>(2)}}); });
  EXPECT_TRUE(contains(e, "position 'pos' is 2, outside [-2, 1]") && contains(e, "SequenceAt")) << e;
}

TEST(Sequences, GraphInputsOfSequenceTypeAreFedAndChecked) {
  onnx::ModelProto m = model_at(17);
  auto& g = *m.mutable_graph();
  sequence_value(g.add_input(), "s", onnx::TensorProto::INT64);
  add_node(g, "SequenceLength", {"s"}, {"n"});
  g.add_output()->set_name("n");
  runtime::Session session(m, {}, {}, "m.onnx");
  const Value s = Value::sequence(ValueType::tensor(DataType::Int64), {i64({1, 2}), i64({3})});
  EXPECT_EQ(session.run_values({{"s", s}}).at("n").tensor().data<int64_t>()[0], 2);
  std::string e = error_of([&] { session.run({{"s", i64({1})}}); });
  EXPECT_TRUE(contains(e, "input 's' expects sequence(int64)") && contains(e, "int64[1]")) << e;
  e = error_of([&] { session.run_values({{"s", Value::sequence(ValueType::tensor(DataType::Float32), {})}}); });
  EXPECT_TRUE(contains(e, "expects sequence(int64)")) << e;
  // A sequence of one element type cannot hold another.
  e = error_of([] { Value::sequence(ValueType::tensor(DataType::Int64), {f32({1}, {1})}); });
  EXPECT_TRUE(contains(e, "cannot hold element 0")) << e;
}

TEST(Sequences, LoopCarriesASequence) {
  // Loop 3 times, inserting the iteration number into a sequence that starts empty.
  onnx::ModelProto m = model_at(17);
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "trips", onnx::TensorProto::INT64, {});
  add_node(g, "SequenceEmpty", {}, {"empty"})->add_attribute()->CopyFrom(attr("dtype", int64_t{onnx::TensorProto::INT64}));
  onnx::GraphProto body;
  body.set_name("body");
  typed_value(body.add_input(), "i", onnx::TensorProto::INT64, {});
  typed_value(body.add_input(), "cond_in", onnx::TensorProto::BOOL, {});
  sequence_value(body.add_input(), "s_in", onnx::TensorProto::INT64);
  add_node(body, "Identity", {"cond_in"}, {"cond_out"});
  add_node(body, "SequenceInsert", {"s_in", "i"}, {"s_out"});
  body.add_output()->set_name("cond_out");
  sequence_value(body.add_output(), "s_out", onnx::TensorProto::INT64);
  auto* loop = add_node(g, "Loop", {"trips", "", "empty"}, {"final"});
  testing::graph_attr(loop, "body", body);
  add_node(g, "ConcatFromSequence", {"final"}, {"stacked"})
      ->add_attribute()->CopyFrom(attr("new_axis", int64_t{1}));
  g.mutable_node(2)->add_attribute()->CopyFrom(attr("axis", int64_t{0}));
  g.add_output()->set_name("stacked");
  runtime::Session session(m);
  const Tensor stacked = session.run({{"trips", Tensor::scalar<int64_t>(3)}}).at("stacked");
  EXPECT_EQ(stacked.shape(), Shape({3}));
  EXPECT_EQ(stacked.to_int64_vector("stacked"), (std::vector<int64_t>{0, 1, 2}));
}

TEST(Optionals, HoldOrNotAndGetElement) {
  onnx::ModelProto m = model_at(18);
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {2});
  add_node(g, "Optional", {"x"}, {"some"});
  auto* none = add_node(g, "Optional", {}, {"none"});
  auto* type = none->add_attribute();
  type->set_name("type");
  type->set_type(onnx::AttributeProto::TYPE_PROTO);
  type->mutable_tp()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  add_node(g, "OptionalHasElement", {"some"}, {"has_some"});
  add_node(g, "OptionalHasElement", {"none"}, {"has_none"});
  add_node(g, "OptionalHasElement", {""}, {"has_absent"});
  add_node(g, "OptionalGetElement", {"some"}, {"got"});
  for (const char* out : {"has_some", "has_none", "has_absent", "got"}) g.add_output()->set_name(out);
  runtime::Session session(m);
  const runtime::NamedTensors out = session.run({{"x", f32({2}, {3, 4})}});
  EXPECT_TRUE(out.at("has_some").data<bool>()[0]);
  EXPECT_FALSE(out.at("has_none").data<bool>()[0]);
  EXPECT_FALSE(out.at("has_absent").data<bool>()[0]);
  testing::expect_close(out.at("got"), f32({2}, {3, 4}));
}

TEST(Optionals, GettingTheElementOfNoneIsAnError) {
  onnx::ModelProto m = model_at(18);
  auto& g = *m.mutable_graph();
  auto* none = add_node(g, "Optional", {}, {"none"});
  auto* type = none->add_attribute();
  type->set_name("type");
  type->set_type(onnx::AttributeProto::TYPE_PROTO);
  type->mutable_tp()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  add_node(g, "OptionalGetElement", {"none"}, {"got"});
  g.add_output()->set_name("got");
  runtime::Session session(m, {}, {}, "m.onnx");
  const std::string e = error_of([&] { session.run({}); });
  EXPECT_TRUE(contains(e, "optional without an element") && contains(e, "OptionalGetElement")) << e;
}

TEST(ValueFiles, SequencesAndOptionalsRoundTripThroughProtoFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "onnxtrain_values_test";
  std::filesystem::create_directories(dir);
  const ValueType seq = ValueType::sequence(ValueType::tensor(DataType::Float32));
  const Value s = Value::sequence(seq.element(), {f32({2}, {1, 2}), f32({1}, {3})});
  io::write_value_pb(s, "s", dir / "s.pb");
  const Value back = io::read_value_pb(dir / "s.pb", seq).second;
  ASSERT_TRUE(back.is_sequence());
  ASSERT_EQ(back.elements().size(), 2u);
  testing::expect_close(back.elements()[1].tensor(), f32({1}, {3}));
  const ValueType opt = ValueType::optional(seq);
  io::write_value_pb(Value::none(seq), "o", dir / "o.pb");
  const Value o = io::read_value_pb(dir / "o.pb", opt).second;
  EXPECT_TRUE(o.is_optional() && !o.has_element());
  io::write_value_pb(Value::optional(seq, s), "o", dir / "o2.pb");
  EXPECT_EQ(io::read_value_pb(dir / "o2.pb", opt).second.element().elements().size(), 2u);
  // A TensorProto is not a valid SequenceProto of the declared type's layout.
  io::write_tensor_pb(strings({2}, {"a", "b"}), "t", dir / "t.pb");
  EXPECT_EQ(string_values(io::read_tensor_pb(dir / "t.pb").second), (std::vector<std::string>{"a", "b"}));
  std::filesystem::remove_all(dir);
}

TEST(Strings, TensorsHoldStringsAndCopyThem) {
  Tensor t = strings({2}, {"hello", std::string(100, 'x')});
  Tensor c = t.clone();
  c.data<std::string>()[0] = "changed";
  EXPECT_EQ(string_values(t)[0], "hello");
  EXPECT_EQ(string_values(c)[1], std::string(100, 'x'));
  EXPECT_EQ(string_values(Tensor::zeros(DataType::String, {3})), (std::vector<std::string>{"", "", ""}));
  // Identity passes strings; Add does not take them.
  EXPECT_EQ(string_values(testing::run1("Identity", 17, {}, {t})), string_values(t));
  const std::string e = error_of([&] { testing::run1("Add", 17, {}, {t, t}); });
  EXPECT_TRUE(contains(e, "element type string")) << e;
}

TEST(Strings, NormalizerDropsStopwordsAndChangesCase) {
  const Tensor x = strings({6}, {"monday", "tuesday", "wednesday", "MONDAY", "Ünïcode", "thursday"});
  Tensor y = testing::run1("StringNormalizer", 10,
                           {attr("case_change_action", std::string("UPPER")), attr("stopwords", std::vector<std::string>{"monday"})},
                           {x});
  // Case-insensitive by default: both spellings of monday go.
  EXPECT_EQ(string_values(y), (std::vector<std::string>{"TUESDAY", "WEDNESDAY", "ÜNÏCODE", "THURSDAY"}));
  y = testing::run1("StringNormalizer", 10,
                    {attr("is_case_sensitive", int64_t{1}), attr("stopwords", std::vector<std::string>{"monday"})}, {x});
  EXPECT_EQ(string_values(y)[0], "tuesday");
  EXPECT_EQ(y.numel(), 5);  // "MONDAY" stays when case matters
  // Everything dropped: one empty string, [1, 1] for a [1, C] input.
  y = testing::run1("StringNormalizer", 10, {attr("stopwords", std::vector<std::string>{"a", "b"})},
                    {strings({1, 2}, {"A", "b"})});
  EXPECT_EQ(y.shape(), Shape({1, 1}));
  EXPECT_EQ(string_values(y)[0], "");
  const std::string e = error_of([&] { testing::run1("StringNormalizer", 10, {}, {strings({2, 2}, {"a", "b", "c", "d"})}); });
  EXPECT_TRUE(contains(e, "[C] or [1, C]")) << e;
}

TEST(Strings, ConcatSplitAndRegex) {
  Tensor y = testing::run1("StringConcat", 20, {}, {strings({2, 1}, {"a", "b"}), strings({3}, {"1", "2", ""})});
  EXPECT_EQ(y.shape(), Shape({2, 3}));
  EXPECT_EQ(string_values(y), (std::vector<std::string>{"a1", "a2", "a", "b1", "b2", "b"}));

  // Whitespace splitting as str.split(); with a delimiter every occurrence splits.
  std::vector<Tensor> out = testing::run_node({.op_type = "StringSplit", .opset = 20, .num_outputs = 2},
                                              {strings({3}, {"  a bc\td ", "", "x"})});
  EXPECT_EQ(out[0].shape(), Shape({3, 3}));
  EXPECT_EQ(string_values(out[0]), (std::vector<std::string>{"a", "bc", "d", "", "", "", "x", "", ""}));
  EXPECT_EQ(out[1].to_int64_vector("z"), (std::vector<int64_t>{3, 0, 1}));
  out = testing::run_node({.op_type = "StringSplit", .opset = 20,
                           .attributes = {attr("delimiter", std::string("--")), attr("maxsplit", int64_t{1})}, .num_outputs = 2},
                          {strings({2}, {"a--b--c", "--"})});
  EXPECT_EQ(string_values(out[0]), (std::vector<std::string>{"a", "b--c", "", ""}));
  EXPECT_EQ(out[1].to_int64_vector("z"), (std::vector<int64_t>{2, 2}));

  y = testing::run1("RegexFullMatch", 20, {attr("pattern", std::string(R"(\w+@(gmail|yahoo)\.com)"))},
                    {strings({3}, {"me@gmail.com", "me@gmail.com.au", "x@yahoo.com"})});
  EXPECT_EQ(y.to_int64_vector("y"), (std::vector<int64_t>{1, 0, 1}));
  const std::string e = error_of([] { testing::run1("RegexFullMatch", 20, {attr("pattern", std::string("(a"))}, {strings({1}, {"a"})}); });
  EXPECT_TRUE(contains(e, "not a valid RE2 expression")) << e;
}

// body(sum, x_t) -> (sum + x_t, sum + x_t): a running sum as the state and the scan output.
onnx::GraphProto running_sum_body(const std::vector<int64_t>& dims) {
  onnx::GraphProto body;
  body.set_name("body");
  typed_value(body.add_input(), "sum_in", onnx::TensorProto::FLOAT, dims);
  typed_value(body.add_input(), "x_t", onnx::TensorProto::FLOAT, dims);
  add_node(body, "Add", {"sum_in", "x_t"}, {"sum_out"});
  add_node(body, "Identity", {"sum_out"}, {"scan_out"});
  body.add_output()->set_name("sum_out");
  body.add_output()->set_name("scan_out");
  return body;
}

TEST(Scan, RunningSumForwardAndBackward) {
  for (int64_t direction : {0, 1}) {
    onnx::ModelProto m = model_at(16);
    auto& g = *m.mutable_graph();
    typed_value(g.add_input(), "init", onnx::TensorProto::FLOAT, {2});
    typed_value(g.add_input(), "xs", onnx::TensorProto::FLOAT, {2, 3});  // scanned along axis 1
    auto* scan = add_node(g, "Scan", {"init", "xs"}, {"final", "partial"});
    testing::graph_attr(scan, "body", running_sum_body({2}));
    scan->add_attribute()->CopyFrom(attr("num_scan_inputs", int64_t{1}));
    scan->add_attribute()->CopyFrom(attr("scan_input_axes", std::vector<int64_t>{-1}));
    scan->add_attribute()->CopyFrom(attr("scan_input_directions", std::vector<int64_t>{direction}));
    g.add_output()->set_name("final");
    g.add_output()->set_name("partial");
    runtime::Session session(m);
    const runtime::NamedTensors out = session.run({{"init", f32({2}, {0, 100})}, {"xs", f32({2, 3}, {1, 2, 3, 4, 5, 6})}});
    testing::expect_close(out.at("final"), f32({2}, {6, 115}));
    // Output slices stacked along axis 0 in scan order.
    const std::vector<float> forward{1, 104, 3, 109, 6, 115}, backward{3, 106, 5, 111, 6, 115};
    testing::expect_close(out.at("partial"), f32({3, 2}, direction ? backward : forward));
  }
}

TEST(Scan, Version8ScansEachBatchEntryUpToItsLength) {
  onnx::ModelProto m = model_at(8);
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "lens", onnx::TensorProto::INT64, {2});
  typed_value(g.add_input(), "init", onnx::TensorProto::FLOAT, {2, 1});
  typed_value(g.add_input(), "xs", onnx::TensorProto::FLOAT, {2, 3, 1});  // batch, sequence, value
  auto* scan = add_node(g, "Scan", {"lens", "init", "xs"}, {"final", "partial"});
  testing::graph_attr(scan, "body", running_sum_body({1}));
  scan->add_attribute()->CopyFrom(attr("num_scan_inputs", int64_t{1}));
  g.add_output()->set_name("final");
  g.add_output()->set_name("partial");
  runtime::Session session(m);
  const runtime::NamedTensors out =
      session.run({{"lens", i64({3, 2})}, {"init", f32({2, 1}, {0, 0})}, {"xs", f32({2, 3, 1}, {1, 2, 3, 10, 20, 30})}});
  testing::expect_close(out.at("final"), f32({2, 1}, {6, 30}));
  testing::expect_close(out.at("partial"), f32({2, 3, 1}, {1, 3, 6, 10, 30, 0}));
}

TEST(Functions, ModelLocalFunctionsAreInlined) {
  // custom.Scale(x) = x * alpha (an attribute reference with a default), called twice.
  onnx::ModelProto m = model_at(18);
  m.set_ir_version(10);
  auto* custom = m.add_opset_import();
  custom->set_domain("custom");
  custom->set_version(1);
  auto* f = m.add_functions();
  f->set_name("Scale");
  f->set_domain("custom");
  f->add_input("x");
  f->add_output("y");
  f->add_attribute_proto()->CopyFrom(attr("alpha", 2.0f));
  f->add_opset_import()->set_version(18);
  auto* c = f->add_node();
  c->set_op_type("Constant");
  c->add_output("a");
  auto* ref = c->add_attribute();
  ref->set_name("value_float");
  ref->set_type(onnx::AttributeProto::FLOAT);
  ref->set_ref_attr_name("alpha");
  auto* mul = f->add_node();
  mul->set_op_type("Mul");
  mul->add_input("x");
  mul->add_input("a");
  mul->add_output("y");
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {2});
  add_node(g, "Scale", {"x"}, {"twice"})->set_domain("custom");
  auto* thrice = add_node(g, "Scale", {"twice"}, {"six_times"});
  thrice->set_domain("custom");
  thrice->add_attribute()->CopyFrom(attr("alpha", 3.0f));
  g.add_output()->set_name("six_times");
  EXPECT_TRUE(runtime::has_functions_to_inline(g, m));
  runtime::Session session(m);
  testing::expect_close(session.run({{"x", f32({2}, {1, -2})}}).at("six_times"), f32({2}, {6, -12}));
}

// IR 10's `overload`: two functions of one name, told apart by it; and a Gradient through a
// call (the call is inlined before the Gradient node is expanded).
TEST(Functions, OverloadsAreToldApartAndCallsAreDifferentiable) {
  onnx::ModelProto m = model_at(18);
  m.set_ir_version(10);
  auto* custom = m.add_opset_import();
  custom->set_domain("custom");
  custom->set_version(1);
  auto* training = m.add_opset_import();
  training->set_domain("ai.onnx.preview.training");
  training->set_version(1);
  for (const char* overload : {"square", "sine"}) {
    auto* f = m.add_functions();
    f->set_name("F");
    f->set_domain("custom");
    f->set_overload(overload);
    f->add_input("x");
    f->add_output("y");
    f->add_opset_import()->set_version(18);
    auto* n = f->add_node();
    n->add_input("x");
    n->add_output("y");
    if (std::string(overload) == "square") {
      n->set_op_type("Mul");
      n->add_input("x");
    } else {
      n->set_op_type("Sin");
    }
  }
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "x", onnx::TensorProto::DOUBLE, {2});
  auto* sq = add_node(g, "F", {"x"}, {"a"});
  sq->set_domain("custom");
  sq->set_overload("square");
  auto* sn = add_node(g, "F", {"a"}, {"b"});
  sn->set_domain("custom");
  sn->set_overload("sine");
  add_node(g, "ReduceSum", {"b"}, {"loss"});
  auto* grad = add_node(g, "Gradient", {"x"}, {"dx"});
  grad->set_domain("ai.onnx.preview.training");
  grad->add_attribute()->CopyFrom(attr("xs", std::vector<std::string>{"x"}));
  grad->add_attribute()->CopyFrom(attr("y", std::string("loss")));
  g.add_output()->set_name("b");
  g.add_output()->set_name("dx");
  runtime::Session session(m);
  const std::vector<double> x{0.5, -1.2};
  const runtime::NamedTensors out = session.run({{"x", Tensor::from_vector<double>({2}, x)}});
  // b = sin(x^2), d sum(b) / dx = 2 x cos(x^2)
  const std::vector<double> b{std::sin(0.25), std::sin(1.44)}, dx{2 * 0.5 * std::cos(0.25), 2 * -1.2 * std::cos(1.44)};
  testing::expect_close(out.at("b"), Tensor::from_vector<double>({2}, b), 1e-12, 1e-12);
  testing::expect_close(out.at("dx"), Tensor::from_vector<double>({2}, dx), 1e-12, 1e-12);
}

TEST(Functions, OpsDefinedAsFunctionsRunThroughTheirBodyWithoutAKernel) {
  // Whichever way Gelu-20 runs (a kernel, or its ONNX function body), it computes the same.
  onnx::ModelProto m = model_at(20);
  auto& g = *m.mutable_graph();
  typed_value(g.add_input(), "x", onnx::TensorProto::FLOAT, {3});
  add_node(g, "Gelu", {"x"}, {"y"});
  g.add_output()->set_name("y");
  const bool kernel = ops::find_kernel("", "Gelu", 20) != nullptr;
  EXPECT_EQ(runtime::has_functions_to_inline(g, m), !kernel);
  const onnx::GraphProto inlined = runtime::inline_functions(g, m, "m");
  if (!kernel) {
    EXPECT_GT(inlined.node_size(), 1);
  }
  runtime::Session session(m);
  const Tensor y = session.run({{"x", f32({3}, {-1, 0, 2})}}).at("y");
  auto gelu = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  testing::expect_close(y, f32({3}, {static_cast<float>(gelu(-1)), 0, static_cast<float>(gelu(2))}), 1e-5, 1e-6);
}

}  // namespace
}  // namespace onnxtrain
