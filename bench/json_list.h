// The --shapes file of the bench tools (bench_conv.cpp, bench_gemm.cpp): a JSON list of objects,
// and the loop both run over it.
#pragma once

#include <omp.h>

#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <oneapi/dnnl/dnnl.hpp>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

// Parses the file at path; throws std::runtime_error naming it when it cannot be read or does
// not hold a JSON list (nlohmann::json::parse_error for malformed JSON).
inline nlohmann::json read_json_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  nlohmann::json list = nlohmann::json::parse(in);
  if (!list.is_array()) throw std::runtime_error(path + ": not a JSON list");
  return list;
}

// Sets the OpenMP thread count (threads > 0), reads the list at path, calls measure on each entry
// and prints one JSON object {key: [results], "total_ms", "gflop"}, the sums of the results'
// "total_ms" and "gflop". Returns the exit status: 0, or 2 after printing "error: ..." to stderr.
inline int measure_each(const std::string& path, int threads, const char* key,
                        const std::function<nlohmann::json(const nlohmann::json&, const dnnl::engine&,
                                                           dnnl::stream&)>& measure) {
  try {
    if (threads > 0) omp_set_num_threads(threads);
    const nlohmann::json list = read_json_list(path);
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    nlohmann::json out{{key, nlohmann::json::array()}};
    double total = 0, gflop = 0;
    for (const auto& j : list) {
      nlohmann::json r = measure(j, engine, stream);
      total += r["total_ms"].get<double>();
      gflop += r["gflop"].get<double>();
      out[key].push_back(std::move(r));
    }
    out["total_ms"] = total;
    out["gflop"] = gflop;
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
