// Conformance runner over the official ONNX backend test data: ONNX 1.12's (Debian
// libonnx-testdata, the default --data) and ONNX 1.23's (tests/conformance/onnx_testdata.py
// lays it out from the onnx wheel).
//
// For every <folder>/<test>/model.onnx and each test_data_set_*: feeds input_<i>.pb to the
// i-th graph input without an initializer, runs the model, and compares output_<i>.pb with
// the i-th graph output: shapes and element types equal; floats within the ONNX runner's
// tolerance |got - expected| <= atol + rtol * |expected| (rtol 1e-3, atol 1e-7), NaN matching
// NaN; everything else exactly. Prints failures, then `conformance: N passed, M failed`.
//
// --manifest FILE: the allow-list; exit 1 when a listed test fails (or does not exist), or,
// over a full run, when a test whose every node has a kernel row for its op version fails
// without a `# fails: ID  reason` line in the manifest saying why.
// --results FILE.json: writes every test's result for tests/conformance/report.py (docs/ops.md):
//   {"runner": "onnxtrain", "data": ROOT, "kernels": [{"op": "ai.onnx.Add", "since": 7,
//    "until": 17, "types": ["float32", ...]}, ...],
//    "tests": [{"id": "node/test_abs", "folder": "node", "passed": true, "reason": "",
//               "ops": [{"op": "ai.onnx.Abs", "version": 13}], "opset": 13,
//               "implemented": true}, ...]}
// with an op's version as ops::op_version gives it (0: ONNX has no schema for it at the model's
// opset) and `implemented` true when every node has a kernel row for its op version (or is a
// Gradient node, which the autodiff engine expands; it is listed with the kernels, with a note).
// tests/conformance/ort_runner.py writes the same shape for ONNX Runtime.
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>

#include "autodiff/gradient.h"
#include "core/dispatch.h"
#include "ops/registry.h"
#include "onnxtrain/error.h"
#include "onnxtrain/io.h"
#include "onnxtrain/session.h"

namespace fs = std::filesystem;
using namespace onnxtrain;

namespace {

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-7;

struct TestResult {
  std::string id;  // "node/test_abs"
  bool passed = false;
  std::string reason;
  std::set<std::pair<std::string, int>> ops;  // ("ai.onnx.Abs", 13): "domain.Op", op version
  int opset = 0;
  // Every node has a kernel row for the op version the model's opset gives it (or is Gradient).
  bool implemented = true;
};

// The Gradient op (ai.onnx.preview.training v1) has no kernel row: the session expands it into
// backward nodes (autodiff/gradient.h), so a model using it is served when those are.
bool is_gradient(std::string_view domain, std::string_view op_type, int version) {
  return domain == autodiff::kTrainingDomain && op_type == "Gradient" && version == 1;
}

void collect_ops(const onnx::GraphProto& g, const std::map<std::string, int>& opsets, TestResult& r) {
  for (const auto& n : g.node()) {
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    const auto opset = opsets.find(domain);
    const int version = opset == opsets.end() ? 0 : ops::op_version(domain, n.op_type(), opset->second);
    r.ops.emplace((domain.empty() ? "ai.onnx" : domain) + "." + n.op_type(), version);
    if (opset == opsets.end() ||
        (!ops::find_kernel(domain, n.op_type(), opset->second) && !is_gradient(domain, n.op_type(), version))) {
      r.implemented = false;
    }
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_ops(a.g(), opsets, r);
      for (const auto& sub : a.graphs()) collect_ops(sub, opsets, r);
    }
  }
}

// The test data stores bfloat16 tensors as uint16 bit patterns (numpy has no bfloat16); read
// them as the bfloat16 the model declares.
Tensor as_bfloat16_if(const Tensor& t, bool wanted) {
  if (!wanted || t.dtype() != DataType::UInt16) return t;
  Tensor out(DataType::BFloat16, t.shape());
  std::memcpy(out.raw_data(), t.raw_data(), t.nbytes());
  return out;
}

// Empty when equal within tolerance, else what differs.
std::string compare(const Tensor& got, const Tensor& expected) {
  if (got.dtype() == DataType::String || expected.dtype() == DataType::String) {
    if (got.dtype() != expected.dtype() || !(got.shape() == expected.shape())) {
      return "expected " + expected.description() + ", got " + got.description();
    }
    for (int64_t i = 0; i < expected.numel(); ++i) {
      if (got.data<std::string>()[i] != expected.data<std::string>()[i]) {
        return "element " + std::to_string(i) + ": expected \"" + expected.data<std::string>()[i] + "\", got \"" +
               got.data<std::string>()[i] + "\"";
      }
    }
    return "";
  }
  if (got.dtype() != expected.dtype() || !(got.shape() == expected.shape())) {
    return "expected " + expected.description() + ", got " + got.description();
  }
  std::string diff;
  visit_dtype<TensorTypes>(expected.dtype(), "output", [&]<class T>() {
    const T* g = got.data<T>();
    const T* e = expected.data<T>();
    for (int64_t i = 0; i < expected.numel() && diff.empty(); ++i) {
      if constexpr (is_float_v<T> || is_narrow_float_v<T>) {
        const double a = convert<double>(g[i]);
        const double b = convert<double>(e[i]);
        const bool ok = (std::isnan(a) && std::isnan(b)) || a == b ||
                        std::abs(a - b) <= kAtol + kRtol * std::abs(b);
        if (!ok) diff = "element " + std::to_string(i) + ": expected " + std::to_string(b) + ", got " + std::to_string(a);
      } else {
        if (!(g[i] == e[i])) {
          diff = "element " + std::to_string(i) + ": expected " + std::to_string(convert<double>(e[i])) +
                 ", got " + std::to_string(convert<double>(g[i]));
        }
      }
    }
  });
  return diff;
}

// Values: the same kind, and element by element the same (tensors as above).
std::string compare(const Value& got, const Value& expected) {
  if (got.kind() != expected.kind()) return "expected " + expected.description() + ", got " + got.description();
  if (expected.is_tensor()) return compare(got.tensor(), expected.tensor());
  if (expected.is_optional()) {
    if (got.has_element() != expected.has_element()) return "expected " + expected.description() + ", got " + got.description();
    return expected.has_element() ? compare(got.element(), expected.element()) : "";
  }
  if (got.elements().size() != expected.elements().size()) {
    return "expected " + expected.description() + ", got " + got.description();
  }
  for (size_t i = 0; i < expected.elements().size(); ++i) {
    const std::string diff = compare(got.elements()[i], expected.elements()[i]);
    if (!diff.empty()) return "sequence element " + std::to_string(i) + ": " + diff;
  }
  return "";
}

std::vector<fs::path> sorted_entries(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path());
  }
  // input_10 after input_9: sort by the number after the last '_'.
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    auto num = [](const fs::path& p) {
      const std::string s = p.stem().string();
      return std::stoi(s.substr(s.rfind('_') + 1));
    };
    return num(a) < num(b);
  });
  return out;
}

TestResult run_test(const fs::path& dir, const std::string& id) {
  TestResult r;
  r.id = id;
  try {
    const onnx::ModelProto model = io::load_model(dir / "model.onnx");
    std::map<std::string, int> opsets{{"ai.onnxtrain", 1}};
    for (const auto& o : model.opset_import()) {
      opsets[o.domain() == "ai.onnx" ? "" : o.domain()] = static_cast<int>(o.version());
      if (o.domain().empty() || o.domain() == "ai.onnx") r.opset = static_cast<int>(o.version());
    }
    collect_ops(model.graph(), opsets, r);
    runtime::Session session(model, {}, dir, (dir / "model.onnx").string());
    const auto data_sets = sorted_entries(dir, "test_data_set_");
    if (data_sets.empty()) throw Error("no test_data_set_* folders");
    for (const fs::path& data : data_sets) {
      runtime::NamedValues feeds;
      const auto inputs = sorted_entries(data, "input_");
      const auto& required = session.inputs();
      if (inputs.size() > required.size()) {
        throw Error(data.filename().string() + " has " + std::to_string(inputs.size()) +
                    " inputs, the model takes " + std::to_string(required.size()));
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        Value v = io::read_value_pb(inputs[i], required[i].type).second;
        if (v.is_tensor()) v = as_bfloat16_if(v.tensor(), required[i].dtype == DataType::BFloat16);
        feeds[required[i].name] = std::move(v);
      }
      const runtime::NamedValues outputs = session.run_values(feeds);
      const auto expected = sorted_entries(data, "output_");
      const auto& declared = session.outputs();
      for (size_t i = 0; i < expected.size(); ++i) {
        if (i >= declared.size()) throw Error("more expected outputs than graph outputs");
        const Value& got = outputs.at(declared[i].name);
        Value want = io::read_value_pb(expected[i], declared[i].type).second;
        if (want.is_tensor()) want = as_bfloat16_if(want.tensor(), got.tensor().dtype() == DataType::BFloat16);
        const std::string diff = compare(got, want);
        if (!diff.empty()) {
          throw Error(data.filename().string() + ", output '" + declared[i].name + "': " + diff);
        }
      }
    }
    r.passed = true;
  } catch (const std::exception& e) {
    r.reason = e.what();
  }
  return r;
}

// The manifest: one test id per line must pass; a comment line `# fails: ID  reason` explains
// why a test whose operators onnxtrain implements does not pass. Other comments are free text.
struct Manifest {
  std::set<std::string> must_pass;
  std::map<std::string, std::string> known_failures;  // id -> reason
};

Manifest read_manifest(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot read the manifest");
  Manifest m;
  std::string line;
  const std::string fails = "# fails:";
  while (std::getline(in, line)) {
    if (line.rfind(fails, 0) == 0) {
      std::istringstream rest(line.substr(fails.size()));
      std::string id, reason;
      rest >> id;
      std::getline(rest, reason);
      if (id.empty() || reason.find_first_not_of(" \t") == std::string::npos) {
        throw Error(path.string() + ": '" + line + "' needs a test id and a reason");
      }
      m.known_failures[id] = reason.substr(reason.find_first_not_of(" \t"));
      continue;
    }
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    line.erase(0, line.find_first_not_of(" \t"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (!line.empty()) m.must_pass.insert(line);
  }
  return m;
}

void write_results(const fs::path& path, const std::string& data_root, const std::vector<TestResult>& results) {
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& def : ops::kernel_table()) {
    const std::string domain = def.domain.empty() ? "ai.onnx" : std::string(def.domain);
    nlohmann::json type_list = nlohmann::json::array();  // empty: the type comes from an attribute
    for (int t = 0; t <= kMaxDataType; ++t) {
      if (def.types.contains(static_cast<DataType>(t))) type_list.push_back(dtype_name(static_cast<DataType>(t)));
    }
    kernels.push_back({{"op", domain + "." + std::string(def.op_type)}, {"since", def.since},
                       {"until", def.until}, {"types", type_list}});
  }
  kernels.push_back({{"op", std::string(autodiff::kTrainingDomain) + ".Gradient"}, {"since", 1}, {"until", 1},
                     {"types", nlohmann::json::array()}, {"note", "expanded into backward nodes by the autodiff engine"}});
  nlohmann::json tests = nlohmann::json::array();
  for (const auto& r : results) {
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& [op, version] : r.ops) ops.push_back({{"op", op}, {"version", version}});
    tests.push_back({{"id", r.id}, {"folder", r.id.substr(0, r.id.find('/'))}, {"passed", r.passed},
                     {"reason", r.reason}, {"ops", ops}, {"opset", r.opset}, {"implemented", r.implemented}});
  }
  const nlohmann::json doc{{"runner", "onnxtrain"}, {"data", fs::absolute(data_root).string()},
                           {"kernels", kernels}, {"tests", tests}};
  // Test messages may quote model bytes: replace invalid UTF-8 rather than throw.
  io::write_file_atomic(path, doc.dump(0, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs the ONNX backend conformance tests"};
  std::string data_root = "/usr/share/libonnx-testdata/data";
  std::vector<std::string> folders = {"node", "simple", "pytorch-converted", "pytorch-operator"};
  std::string filter, manifest_path, results_path;
  bool verbose = false, list_passing = false, list_unexplained = false;
  app.add_option("--data", data_root, "root of the test data");
  app.add_option("--folders", folders, "folders under the root")->delimiter(',');
  app.add_option("--filter", filter, "run only tests whose id (folder/test) matches this regex");
  app.add_option("--manifest", manifest_path, "allow-list of tests that must pass");
  app.add_option("--results", results_path, "write every test's result here (JSON, for tests/conformance/report.py)");
  app.add_flag("-v,--verbose", verbose, "print every test, not only failures");
  app.add_flag("--list-passing", list_passing, "print the ids of passing tests (for the manifest)");
  app.add_flag("--list-unexplained", list_unexplained,
               "print failing tests that use only implemented operators and have no '# fails:' line");
  CLI11_PARSE(app, argc, argv);

  try {
    Manifest manifest;
    if (!manifest_path.empty()) manifest = read_manifest(manifest_path);
    const std::regex pattern(filter.empty() ? ".*" : filter);
    std::vector<TestResult> results;
    for (const auto& folder : folders) {
      const fs::path dir = fs::path(data_root) / folder;
      if (!fs::is_directory(dir)) throw Error(dir.string() + ": no such folder (install libonnx-testdata)");
      std::vector<fs::path> tests;
      for (const auto& e : fs::directory_iterator(dir)) tests.push_back(e.path());
      std::sort(tests.begin(), tests.end());
      for (const auto& t : tests) {
        const std::string id = folder + "/" + t.filename().string();
        if (!std::regex_search(id, pattern)) continue;
        const auto start = std::chrono::steady_clock::now();
        results.push_back(run_test(t, id));
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        const auto& r = results.back();
        if (verbose || !r.passed) {
          std::cout << (r.passed ? "PASS " : "FAIL ") << r.id << (r.passed ? "" : ": " + r.reason);
          if (verbose) std::cout << " (" << static_cast<int>(ms) << " ms)";
          std::cout << "\n";
        }
      }
    }
    int passed = 0;
    std::vector<std::string> regressions, unexplained;
    std::set<std::string> seen;
    for (const auto& r : results) {
      seen.insert(r.id);
      if (r.passed) ++passed;
      if (list_passing && r.passed) std::cout << r.id << "\n";
      if (!r.passed && manifest.must_pass.contains(r.id)) regressions.push_back(r.id);
      if (!r.passed && !manifest.must_pass.contains(r.id) && !manifest.known_failures.contains(r.id) &&
          r.implemented) {
        unexplained.push_back(r.id + ": " + r.reason);
      }
    }
    if (list_unexplained) {
      for (const auto& line : unexplained) std::cout << "UNEXPLAINED " << line << "\n";
    }
    if (filter.empty()) {
      for (const auto& id : manifest.must_pass) {
        const std::string folder = id.substr(0, id.find('/'));
        if (std::find(folders.begin(), folders.end(), folder) != folders.end() && !seen.contains(id)) {
          regressions.push_back(id + " (not found)");
        }
      }
    }
    if (!results_path.empty()) write_results(results_path, data_root, results);
    for (const auto& id : regressions) std::cout << "REGRESSION (listed in the manifest): " << id << "\n";
    const bool check_unexplained = !manifest_path.empty() && filter.empty();
    if (check_unexplained && !list_unexplained) {
      for (const auto& line : unexplained) {
        std::cout << "UNEXPLAINED (uses only implemented operators, no '# fails:' line): " << line << "\n";
      }
    }
    std::cout << "conformance: " << passed << " passed, " << results.size() - static_cast<size_t>(passed)
              << " failed\n";
    return regressions.empty() && (!check_unexplained || unexplained.empty()) ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
