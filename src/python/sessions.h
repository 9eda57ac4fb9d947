// onnxtrain.InferenceSession, onnxtrain.TrainingSession and onnxtrain.ValueInfo, with their
// docstrings (numpydoc: shapes, dtypes, errors, and the spec each behaviour comes from).
#pragma once

#include <nanobind/nanobind.h>

namespace onnxtrain::python {

void bind_sessions(nanobind::module_& m);

inline constexpr const char* kInferenceSessionDoc = R"(Runs the inference graph (ModelProto.graph) of an ONNX model on the CPU.

    session = onnxtrain.InferenceSession("model.onnx")
    outputs = session.run({"x": numpy.ones((1, 784), numpy.float32)})   # {"y": ndarray}

Plans are made once per input-shape signature and reused (kernels with parsed attributes,
oneDNN primitives, a memory arena). The C++ counterpart is onnxtrain::runtime::Session.

Parameters
----------
model : str | os.PathLike | onnx.ModelProto | bytes
    A model file (external data is read from its folder), a ModelProto, or its serialized bytes.
threads : int, optional
    Threads for OpenMP kernels and oneDNN primitives; None or 0 keeps the OpenMP default
    (OMP_NUM_THREADS, else one per core). Applies process-wide.
seed : int
    Seed of random ops without a `seed` attribute (RandomNormal, Dropout in training mode):
    the same seed gives the same numbers in a new session.
fuse : bool
    Plan with the runtime's rewrites (constant folding, fused Conv-Relu-MaxPool); results agree
    to rounding either way.

Raises
------
onnxtrain.Error
    A file that cannot be read or parsed, an invalid graph, an unsupported opset or operator.
TypeError
    `model` of another type.

Notes
-----
One session is not safe to run from several threads at once in C++; here every call takes the
session's lock, so concurrent calls on one session run one after the other. Separate sessions
run in parallel: the GIL is released while a session loads, plans and runs.
)";

inline constexpr const char* kRunDoc = R"(Runs the graph on `feeds` and returns every graph output.

Parameters
----------
feeds : Mapping[str, array]
    One array per input of `inputs` (by name): a NumPy array, a PyTorch CPU tensor, anything
    with __dlpack__ or the buffer protocol, or a scalar or nested list (through numpy.asarray).
    The element type must be the declared one exactly (no conversion: float64 for a float32
    input is an error), the rank the declared rank, fixed dims equal. bfloat16, float8, int4,
    ... as ml_dtypes arrays or PyTorch tensors; strings as str, bytes or object arrays. Inputs
    declared as sequences take lists, optionals take None or a value.

Returns
-------
dict[str, numpy.ndarray]
    Every graph output by name, in the declared element type (ml_dtypes' types for bfloat16,
    float8, int4, ...; object arrays of str for strings). A sequence output is a list of arrays,
    an optional one None or its value. The arrays are the session's results, never copied:
    writable, except where the memory is shared with something the session keeps or with
    another output or input (an output that is an initializer, a training step's new weights,
    which are also the new state); those are read-only, and numpy.array(a) gives a writable
    copy. The session never writes into them afterwards.

Raises
------
onnxtrain.Error
    A missing or unknown feed, a wrong element type, rank or dim (the message names the input,
    expected and got), or a failing node (named, with its op type).
TypeError
    `feeds` not a mapping with str keys, or a value that is no array.
)";

inline constexpr const char* kTrainingSessionDoc = R"(Trains a model that carries ModelProto.training_info (TrainingInfoProto), as the ONNX spec defines it.

    session = onnxtrain.TrainingSession(onnxtrain.make_trainable("model.onnx", optimizer="adam", lr=1e-3))
    session.initialize()                                   # the initialization graphs, if wanted
    for x, y in batches:
        loss = session.step({"x": x, "label": y})["onnxtrain.loss"]
    session.save("trained.onnx")

The mutable variables (state) are the initializers named as keys of an update_binding or an
initialization_binding (onnx.proto, TrainingInfoProto); every other initializer is a constant.
step() evaluates, for each TrainingInfoProto in order, the inference graph followed by the
algorithm with the current state, then assigns every update_binding value to its key at once;
a step that fails changes no variable. The C++ counterpart is onnxtrain::training::TrainingSession.

Parameters
----------
model : str | os.PathLike | onnx.ModelProto | bytes
    A model with training_info (see make_trainable).
seed : int
    Seed of random ops without a `seed` attribute (RandomNormal in an initialization graph,
    Dropout in training mode); random numbers depend only on the seed, the node and the number
    of earlier steps, so runs are reproducible.
threads : int, optional
    Threads for kernels, as for InferenceSession.
nan_guard : bool
    Reject a step or initialization whose bound values hold NaN or Inf (onnxtrain.Error, state
    unchanged).
fuse : bool
    Plan with the runtime's rewrites, as for InferenceSession.

Raises
------
onnxtrain.Error
    An unreadable model, a training_info that breaks the spec's rules (the entry, binding and
    tensor named), an unsupported operator.

Notes
-----
Calls on one session from several threads run one after the other (the session's lock);
separate sessions run in parallel, with the GIL released while they run.
)";

inline constexpr const char* kInitializeDoc = R"(Runs every initialization graph in order and assigns its outputs through initialization_binding.

For make_trainable's program: resets the optimizer state and the step counter and, with an
`init` other than keep, re-draws the weights. Raises onnxtrain.Error on failure (state unchanged).
)";

inline constexpr const char* kStepDoc = R"(One training step: every TrainingInfoProto in order, or only `algorithm`.

Parameters
----------
feeds : Mapping[str, array]
    The inputs of step_inputs() (the inference graph's and the algorithm's, e.g. "label"),
    with the exact element types and ranks declared (see InferenceSession.run). A feed that no
    algorithm takes is an error.
algorithm : int, optional
    Run only this TrainingInfoProto (IR.md allows invoking one algorithm).

Returns
-------
dict[str, numpy.ndarray]
    The outputs of every combined graph by name (make_trainable's: the model outputs,
    "onnxtrain.loss" and "onnxtrain.lr").

Raises
------
onnxtrain.Error
    A missing, unknown or ill-typed feed, a failing node, a bound value of another type or
    shape than its variable, NaN or Inf in a bound value with nan_guard: the state is unchanged.
IndexError
    `algorithm` out of range.
)";

inline constexpr const char* kInferDoc = R"(Runs the inference graph alone with the current state.

Parameters and results as InferenceSession.run (feeds: the inputs of inference_inputs).
)";

inline constexpr const char* kStateDoc = R"(Every mutable variable by name, as read-only NumPy arrays.

The arrays view the session's tensors without a copy. The session replaces a variable's tensor
on each step instead of writing into it, so an array keeps the values it had when read; call
`state` again after a step for the new ones. Use numpy.array(a) for a writable copy, and
set_state to change a variable.
)";

inline constexpr const char* kSetStateDoc = R"(Replaces variables: set_state(name, value) or set_state({name: value, ...}).

The values are copied (later changes to your arrays do not reach the session). Each must have
the variable's element type and shape exactly. With a mapping, a failure part of the way
leaves every variable as it was.

Raises
------
onnxtrain.Error
    An unknown name ("is not a mutable variable of the model") or a value of another element
    type or shape than the variable's.
)";

inline constexpr const char* kSaveDoc = R"(Writes the model with every variable at its current value, training_info kept.

The file is written atomically (a temporary file in the same folder, fsync, rename): on any
error the previous file is left as it was and nothing else is left behind. Models over 2 GiB
keep large initializers in "<file name>.data" beside it (ONNX external data).

Parameters
----------
path : str | os.PathLike
metadata : dict[str, str], optional
    Entries set in ModelProto.metadata_props (replacing equal keys).

Raises
------
onnxtrain.Error
    A folder that does not exist or is not writable, a full disk.
)";

inline constexpr const char* kModelDoc = R"(The model save() would write, as an onnx.ModelProto: variables at their current values, training_info kept.

Tensors stored as external data are read in. export_inference(session.model()) gives the
inference model.
)";

}  // namespace onnxtrain::python
