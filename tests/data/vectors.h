// Reading the shared test vectors of tests/data (JSON written by the Python
// implementations through tests/data/vectors.py): the C++ tests of the same
// rules check every row. A missing or malformed file, or a missing field,
// fails the test that reads it.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace reshard::test_vectors {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

/// The file at `path`, parsed.
inline Struct Load(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream text;
  text << in.rdbuf();
  Struct root;
  const auto status = google::protobuf::util::JsonStringToMessage(text.str(), &root);
  EXPECT_TRUE(status.ok()) << path << ": " << status;
  return root;
}

/// `s[key]`; a null value (and a failure) when absent.
inline const Value& Field(const Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  EXPECT_NE(it, s.fields().end()) << "no field \"" << key << "\"";
  static const Value* null = new Value();
  return it == s.fields().end() ? *null : it->second;
}
inline const Value& Field(const Value& row, const std::string& key) {
  return Field(row.struct_value(), key);
}
inline const ListValue& List(const Struct& s, const std::string& key) {
  return Field(s, key).list_value();
}

/// A 64-bit value: a decimal string, or a number below 2^53 (exact as a double).
inline uint64_t U64(const Value& v) {
  if (v.kind_case() == Value::kStringValue) return std::stoull(v.string_value());
  EXPECT_EQ(v.kind_case(), Value::kNumberValue);
  EXPECT_LT(v.number_value(), 9007199254740992.0);
  return static_cast<uint64_t>(v.number_value());
}
inline uint64_t U64(const Struct& s, const std::string& key) { return U64(Field(s, key)); }
/// A small integer (exact as a double).
inline int64_t Int(const Value& row, const std::string& key) {
  return static_cast<int64_t>(Field(row, key).number_value());
}
inline double Number(const Value& row, const std::string& key) {
  return Field(row, key).number_value();
}
inline const std::string& Text(const Value& row, const std::string& key) {
  return Field(row, key).string_value();
}
inline bool Bool(const Value& row, const std::string& key) { return Field(row, key).bool_value(); }

}  // namespace reshard::test_vectors
