// The --shapes file of the bench tools (bench_conv.cpp, bench_gemm.cpp): a JSON list of objects.
#pragma once

#include <fstream>
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
