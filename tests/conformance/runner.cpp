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
// without a
// `# fails: ID  reason` line in the manifest saying why.
// --ops-doc FILE: writes the operator table (docs/ops.md) from the registry and the results.
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
  std::set<std::string> ops;  // "Abs", "ai.onnx.preview.training.Adam"
  int opset = 0;
  // Every node has a kernel row for the op version the model's opset gives it.
  bool implemented = true;
};

void collect_ops(const onnx::GraphProto& g, const std::map<std::string, int>& opsets, TestResult& r) {
  for (const auto& n : g.node()) {
    const std::string domain = n.domain() == "ai.onnx" ? "" : n.domain();
    r.ops.insert(domain.empty() ? n.op_type() : domain + "." + n.op_type());
    const auto opset = opsets.find(domain);
    if (opset == opsets.end() || !ops::find_kernel(domain, n.op_type(), opset->second)) r.implemented = false;
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


void write_ops_doc(const fs::path& path, const std::vector<TestResult>& results) {
  std::map<std::string, std::pair<int, int>> per_op;  // passed, total
  for (const auto& r : results) {
    for (const auto& op : r.ops) {
      per_op[op].second++;
      if (r.passed) per_op[op].first++;
    }
  }
  std::ostringstream out;
  out << "# Operators\n\n"
      << "Generated by `onnxtrain-conformance --ops-doc docs/ops.md` from the kernel registry\n"
      << "(`src/ops/registry.cpp`) and the official ONNX backend tests (Debian `libonnx-testdata`).\n"
      << "Opsets are versions of the model's `opset_import` for the op's domain. \"Tests\" counts the\n"
      << "backend tests whose model uses the op, passed/total; a test can fail because of another op\n"
      << "it uses, or because it is not listed in `tests/conformance/expected_pass.txt`.\n\n"
      << "| operator | opsets | element types | tests |\n|---|---|---|---|\n";
  std::vector<std::string> order;
  std::map<std::string, std::vector<const ops::KernelDef*>> rows;
  for (const auto& def : ops::kernel_table()) {
    const std::string name = def.domain.empty() ? std::string(def.op_type)
                                                : std::string(def.domain) + "." + std::string(def.op_type);
    if (!rows.contains(name)) order.push_back(name);
    rows[name].push_back(&def);
  }
  std::sort(order.begin(), order.end());
  for (const auto& name : order) {
    std::string opsets, types;
    for (const auto* def : rows[name]) {
      if (!opsets.empty()) opsets += ", ";
      opsets += std::to_string(def->since) + "-" + std::to_string(def->until);
    }
    types = rows[name].back()->types.empty() ? "(from attribute)" : rows[name].back()->types.to_string();
    const auto counts = per_op.contains(name) ? per_op[name] : std::pair<int, int>{0, 0};
    out << "| " << name << " | " << opsets << " | " << types << " | "
        << (counts.second ? std::to_string(counts.first) + "/" + std::to_string(counts.second) : "-") << " |\n";
  }
  out << "\n## Used by the backend tests but not implemented\n\n| operator | tests |\n|---|---|\n";
  for (const auto& [op, counts] : per_op) {
    if (!rows.contains(op)) out << "| " << op << " | " << counts.second << " |\n";
  }
  io::write_file_atomic(path, out.str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs the ONNX backend conformance tests"};
  std::string data_root = "/usr/share/libonnx-testdata/data";
  std::vector<std::string> folders = {"node", "simple", "pytorch-converted", "pytorch-operator"};
  std::string filter, manifest_path, ops_doc;
  bool verbose = false, list_passing = false, list_unexplained = false;
  app.add_option("--data", data_root, "root of the test data");
  app.add_option("--folders", folders, "folders under the root")->delimiter(',');
  app.add_option("--filter", filter, "run only tests whose id (folder/test) matches this regex");
  app.add_option("--manifest", manifest_path, "allow-list of tests that must pass");
  app.add_option("--ops-doc", ops_doc, "write the operator table (markdown) here");
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
    if (!ops_doc.empty()) write_ops_doc(ops_doc, results);
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
