// Sequence and optional operators (ONNX operator docs; ONNX IR.md "Static types").
//
// A sequence is an ordered list of tensors of one element type (a Value of kind Sequence); an
// optional holds one value or none. The ops build new values, never change their inputs.
//   SequenceEmpty (11): an empty sequence of tensors of `dtype` (default float32).
//   SequenceConstruct (11): the inputs, which share one element type, as a sequence.
//   SequenceInsert (11): S with a tensor inserted before `position` (default: at the end);
//     position in [-n, n], negative counting from the back.
//   SequenceAt (11): the element at `position`, in [-n, n-1].
//   SequenceErase (11): S without the element at `position` (default: the last).
//   SequenceLength (11): the number of elements, an int64 scalar.
//   ConcatFromSequence (11): the elements concatenated along `axis`, or stacked along a new
//     axis when new_axis = 1 (axis in [-r-1, r] then).
//   SplitToSequence (11): the input split along `axis` into pieces of `split` (a scalar: equal
//     pieces of that length, the last one shorter; a 1-D tensor: the lengths), or into pieces of
//     length 1 when `split` is absent, whose axis is squeezed unless keepdims = 1.
//   Optional (15): an optional holding the input, or none of the type `type` without input.
//   OptionalHasElement (15, 18): whether the input holds an element; from version 18 the input
//     may also be a tensor or a sequence (true) or absent (false).
//   OptionalGetElement (15, 18): the element of an optional (an error when it has none); from
//     version 18 a tensor or sequence input is returned as it is.
#include <cstring>

#include "ops/concat.h"
#include "ops/factories.h"
#include "ops/data_movement.h"

namespace onnxtrain::ops {

namespace {

const Value& sequence_input(KernelContext& ctx, int i) {
  const Value& v = ctx.input_value(i);
  if (!v.is_sequence()) {
    fail("input " + ctx.input_name(i) + " must be a sequence, got " + v.description());
  }
  return v;
}

// `position` resolved against a sequence of n elements: in [-n, n-1], or [-n, n] for inserts.
int64_t resolve_position(const Tensor& position, int64_t n, bool insert, const std::string& what) {
  if (position.dtype() != DataType::Int64 && position.dtype() != DataType::Int32) {
    fail(what + " must be int32 or int64, got " + position.description());
  }
  int64_t p = scalar_int64(position, what);
  const int64_t high = insert ? n : n - 1;
  if (p < -n || p > high) {
    fail(what + " is " + std::to_string(p) + ", outside [" + std::to_string(-n) + ", " + std::to_string(high) +
         "] for a sequence of " + std::to_string(n));
  }
  return p < 0 ? p + n : p;
}

ValueType tensor_type_of(DataType dtype) { return ValueType::tensor(dtype); }

std::unique_ptr<Kernel> make_sequence_empty(const KernelInit& init) {
  const int64_t code = init.attr_int("dtype", static_cast<int64_t>(DataType::Float32));
  const DataType dtype = dtype_from_onnx(static_cast<int32_t>(code), "SequenceEmpty attribute 'dtype'");
  return make_kernel([dtype](KernelContext& ctx) { ctx.set_output_value(0, Value::sequence(tensor_type_of(dtype), {})); });
}

std::unique_ptr<Kernel> make_sequence_construct(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    if (ctx.num_inputs() == 0) fail("needs at least one input");
    std::vector<Value> elements;
    const DataType dtype = ctx.input(0).dtype();
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      if (t.dtype() != dtype) {
        fail("input " + ctx.input_name(i) + " is " + t.description() + " but input " + ctx.input_name(0) + " is " +
             std::string(dtype_name(dtype)) + ": a sequence holds one element type");
      }
      elements.emplace_back(t);
    }
    ctx.set_output_value(0, Value::sequence(tensor_type_of(dtype), std::move(elements)));
  });
}

std::unique_ptr<Kernel> make_sequence_insert(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Value& s = sequence_input(ctx, 0);
    const Tensor& t = ctx.input(1);
    const ValueType element = s.element_type();
    if (!has_type(Value(t), element)) {
      fail("input " + ctx.input_name(1) + " is " + t.description() + " but the sequence holds " + element.to_string());
    }
    std::vector<Value> elements = s.elements();
    const auto n = static_cast<int64_t>(elements.size());
    const int64_t at = ctx.has_input(2) ? resolve_position(ctx.input(2), n, true, "position " + ctx.input_name(2)) : n;
    elements.insert(elements.begin() + at, Value(t));
    ctx.set_output_value(0, Value::sequence(element, std::move(elements)));
  });
}

std::unique_ptr<Kernel> make_sequence_at(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Value& s = sequence_input(ctx, 0);
    const auto n = static_cast<int64_t>(s.elements().size());
    const int64_t at = resolve_position(ctx.input(1), n, false, "position " + ctx.input_name(1));
    ctx.set_output_value(0, s.elements()[static_cast<size_t>(at)]);
  });
}

std::unique_ptr<Kernel> make_sequence_erase(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Value& s = sequence_input(ctx, 0);
    std::vector<Value> elements = s.elements();
    const auto n = static_cast<int64_t>(elements.size());
    if (n == 0) fail("cannot erase from the empty sequence " + ctx.input_name(0));
    const int64_t at = ctx.has_input(1) ? resolve_position(ctx.input(1), n, false, "position " + ctx.input_name(1)) : n - 1;
    elements.erase(elements.begin() + at);
    ctx.set_output_value(0, Value::sequence(s.element_type(), std::move(elements)));
  });
}

std::unique_ptr<Kernel> make_sequence_length(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    const Value& s = sequence_input(ctx, 0);
    ctx.allocate_output(0, DataType::Int64, Shape{}).data<int64_t>()[0] = static_cast<int64_t>(s.elements().size());
  });
}

std::unique_ptr<Kernel> make_concat_from_sequence(const KernelInit& init) {
  const int64_t axis_attr = init.required_int("axis");
  const bool new_axis = init.attr_int("new_axis", 0) != 0;
  return make_kernel([axis_attr, new_axis](KernelContext& ctx) {
    const Value& s = sequence_input(ctx, 0);
    if (s.elements().empty()) fail("cannot concatenate the empty sequence " + ctx.input_name(0));
    std::vector<Tensor> parts;
    for (const Value& v : s.elements()) parts.push_back(v.tensor());
    const auto rank = static_cast<int64_t>(parts[0].rank());
    const int64_t out_rank = rank + (new_axis ? 1 : 0);
    if (axis_attr < -out_rank || axis_attr >= out_rank) {
      fail("attribute 'axis' is " + std::to_string(axis_attr) + ", outside [" + std::to_string(-out_rank) + ", " +
           std::to_string(out_rank - 1) + "] for elements of rank " + std::to_string(rank) +
           (new_axis ? " and new_axis = 1" : ""));
    }
    const auto axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + out_rank : axis_attr);
    if (new_axis) {
      for (Tensor& p : parts) {
        Shape shape = p.shape();
        shape.insert(axis, 1);
        p = p.view(shape);
      }
    } else if (rank == 0) {
      fail("the elements of " + ctx.input_name(0) + " are scalars; concatenating needs rank >= 1 (or new_axis = 1)");
    }
    const Shape shape = concat_shape(parts, axis, "element of " + ctx.input_name(0));
    concat_into(parts, axis, ctx.allocate_output(0, parts[0].dtype(), shape));
  });
}

std::unique_ptr<Kernel> make_split_to_sequence(const KernelInit& init) {
  const int64_t axis_attr = init.attr_int("axis", 0);
  const bool keepdims = init.attr_int("keepdims", 1) != 0;
  return make_kernel([axis_attr, keepdims](KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.rank());
    if (axis_attr < -rank || axis_attr >= rank) {
      fail("attribute 'axis' is " + std::to_string(axis_attr) + ", outside [" + std::to_string(-rank) + ", " +
           std::to_string(rank - 1) + "] for input " + ctx.input_name(0) + " " + x.description());
    }
    const auto axis = static_cast<size_t>(axis_attr < 0 ? axis_attr + rank : axis_attr);
    const int64_t length = x.dim(axis);
    std::vector<int64_t> sizes;
    bool squeeze = false;
    if (!ctx.has_input(1)) {
      sizes.assign(static_cast<size_t>(length), 1);
      squeeze = !keepdims;
    } else {
      const Tensor& split = ctx.input(1);
      if (split.dtype() != DataType::Int64 && split.dtype() != DataType::Int32) {
        fail("split " + ctx.input_name(1) + " must be int32 or int64, got " + split.description());
      }
      const std::vector<int64_t> values = split.to_int64_vector("split " + ctx.input_name(1));
      if (split.rank() == 0) {
        if (values[0] <= 0) fail("split " + ctx.input_name(1) + " must be positive, got " + std::to_string(values[0]));
        for (int64_t done = 0; done < length; done += values[0]) sizes.push_back(std::min(values[0], length - done));
      } else if (split.rank() == 1) {
        int64_t total = 0;
        for (int64_t v : values) {
          if (v < 0) fail("split " + ctx.input_name(1) + " has a negative length " + std::to_string(v));
          total += v;
        }
        if (total != length) {
          fail("split " + ctx.input_name(1) + " sums to " + std::to_string(total) + " but dim " + std::to_string(axis) +
               " of " + ctx.input_name(0) + " " + x.description() + " is " + std::to_string(length));
        }
        sizes = values;
      } else {
        fail("split " + ctx.input_name(1) + " must be a scalar or 1-D, got " + split.description());
      }
    }
    std::vector<Value> elements;
    const size_t elem = dtype_size(x.dtype());
    const int64_t outer = x.shape().numel(0, axis);
    const int64_t inner = x.shape().numel(axis + 1, x.rank());
    int64_t offset = 0;
    for (int64_t size : sizes) {
      Shape shape = x.shape();
      shape[axis] = size;
      Tensor piece(x.dtype(), shape);
      const auto row = static_cast<size_t>(size * inner) * elem;
      const auto* src = static_cast<const char*>(x.raw_data());
      auto* dst = static_cast<char*>(piece.raw_data());
      for (int64_t o = 0; o < outer && row > 0; ++o) {
        std::memcpy(dst + static_cast<size_t>(o) * row, src + (static_cast<size_t>(o * length + offset) * inner) * elem, row);
      }
      offset += size;
      if (squeeze) shape.erase(axis);
      elements.emplace_back(piece.view(shape));
    }
    ctx.set_output_value(0, Value::sequence(tensor_type_of(x.dtype()), std::move(elements)));
  });
}

// The type the `type` attribute of Optional names (a TypeProto, kept by the IR as its
// ValueType).
std::unique_ptr<Kernel> make_optional(const KernelInit& init) {
  std::optional<ValueType> declared;
  if (const ir::Attribute* a = init.attr("type")) {
    if (a->type != ir::AttributeType::TypeProto) fail("attribute 'type' must be a TypeProto");
    declared = a->value_type;
  }
  if (!init.has_input(0) && !declared) fail("an Optional without input needs the attribute 'type'");
  return make_kernel([declared](KernelContext& ctx) {
    if (!ctx.has_input(0)) {
      ctx.set_output_value(0, Value::none(*declared));
      return;
    }
    const Value& v = ctx.input_value(0);
    if (v.is_optional()) fail("input " + ctx.input_name(0) + " is already an optional: " + v.description());
    ctx.set_output_value(0, Value::optional(declared ? *declared : v.type(), v));
  });
}

std::unique_ptr<Kernel> make_optional_has_element(const KernelInit&) {
  return make_kernel([](KernelContext& ctx) {
    bool has = false;
    if (ctx.has_input(0)) {
      const Value& v = ctx.input_value(0);
      has = v.is_optional() ? v.has_element() : true;
    }
    ctx.allocate_output(0, DataType::Bool, Shape{}).data<bool>()[0] = has;
  });
}

std::unique_ptr<Kernel> make_optional_get_element(const KernelInit& init) {
  const bool any_input = init.opset() >= 18;
  return make_kernel([any_input](KernelContext& ctx) {
    const Value& v = ctx.input_value(0);
    if (!v.is_optional()) {
      if (!any_input) fail("input " + ctx.input_name(0) + " must be an optional, got " + v.description());
      ctx.set_output_value(0, v);
      return;
    }
    if (!v.has_element()) fail("input " + ctx.input_name(0) + " is an optional without an element");
    ctx.set_output_value(0, v.element());
  });
}

}  // namespace

std::unique_ptr<Kernel> make_sequence_op(const KernelInit& init) {
  const std::string& op = init.op_type();
  if (op == "SequenceEmpty") return make_sequence_empty(init);
  if (op == "SequenceConstruct") return make_sequence_construct(init);
  if (op == "SequenceInsert") return make_sequence_insert(init);
  if (op == "SequenceAt") return make_sequence_at(init);
  if (op == "SequenceErase") return make_sequence_erase(init);
  if (op == "SequenceLength") return make_sequence_length(init);
  if (op == "ConcatFromSequence") return make_concat_from_sequence(init);
  if (op == "SplitToSequence") return make_split_to_sequence(init);
  if (op == "Optional") return make_optional(init);
  if (op == "OptionalHasElement") return make_optional_has_element(init);
  if (op == "OptionalGetElement") return make_optional_get_element(init);
  fail("no sequence kernel for " + op);
}

}  // namespace onnxtrain::ops
