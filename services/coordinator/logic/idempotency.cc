#include "services/coordinator/logic/idempotency.h"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>

#include "absl/strings/strip.h"
#include "common/log.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace reshard::coordinator {

std::string RequestHash(const google::protobuf::Message& request) {
  std::unique_ptr<google::protobuf::Message> copy(request.New());
  copy->CopyFrom(request);
  const google::protobuf::FieldDescriptor* key =
      copy->GetDescriptor()->FindFieldByName("idempotency_key");
  if (key != nullptr) copy->GetReflection()->ClearField(copy.get(), key);

  // Default serialization may order map entries differently between runs;
  // deterministic mode makes equal messages give equal bytes.
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    // Cannot fail: proto3 has no required fields, and a message that was
    // parsed from the wire is under protobuf's 2 GiB limit.
    RESHARD_CHECK(copy->SerializeToCodedStream(&out))
        << "cannot serialize a " << copy->GetTypeName();
  }

  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  RESHARD_CHECK(
      EVP_Digest(bytes.data(), bytes.size(), digest, &digest_len, EVP_sha256(), nullptr) == 1)
      << "SHA-256 failed";
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest_len);
  for (unsigned int i = 0; i < digest_len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

std::string RequestMethod(const google::protobuf::Message& request) {
  const std::string& name = request.GetDescriptor()->name();
  static constexpr absl::string_view kSuffix = "Request";
  return std::string(absl::StripSuffix(name, kSuffix));
}

Idempotency MakeIdempotency(const KeyScope& scope, const google::protobuf::Message& request) {
  const google::protobuf::FieldDescriptor* field =
      request.GetDescriptor()->FindFieldByName("idempotency_key");
  // Every mutating call carries one (proto/reshard/v1/coordinator.proto).
  RESHARD_CHECK(field != nullptr && field->type() == google::protobuf::FieldDescriptor::TYPE_STRING)
      << request.GetTypeName() << " has no idempotency_key";
  Idempotency idem;
  idem.key = request.GetReflection()->GetString(request, field);
  if (idem.key.empty()) return idem;
  idem.tenants = scope.tenants;
  std::sort(idem.tenants.begin(), idem.tenants.end());
  idem.tenants.erase(std::unique(idem.tenants.begin(), idem.tenants.end()), idem.tenants.end());
  idem.method = RequestMethod(request);
  idem.request_hash = RequestHash(request);
  return idem;
}

}  // namespace reshard::coordinator
