#include "services/coordinator/store/pg_codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/coordinator/store/operation_machine.h"

namespace reshard::coordinator::pg {
namespace {

constexpr size_t kPackedChecksumBytes = 20;

void PutLe(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string TextArray(const std::vector<std::string>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.push_back('"');
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

std::string IntArray(const std::vector<int64_t>& values) {
  std::string out = "{";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out.push_back(',');
    absl::StrAppend(&out, values[i]);
  }
  out.push_back('}');
  return out;
}

pqxx::binarystring Bytea(const google::protobuf::MessageLite& message) {
  const std::string bytes = message.SerializeAsString();
  return pqxx::binarystring(bytes.data(), bytes.size());
}

pqxx::binarystring Bytea(absl::string_view bytes) {
  return pqxx::binarystring(bytes.data(), bytes.size());
}

std::string Hex(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

std::vector<std::string> ParseTextArray(const pqxx::field& field) {
  std::vector<std::string> out;
  if (field.is_null()) return out;
  pqxx::array_parser parser = field.as_array();
  for (;;) {
    std::pair<pqxx::array_parser::juncture, std::string> next = parser.get_next();
    if (next.first == pqxx::array_parser::done) break;
    if (next.first == pqxx::array_parser::string_value) out.push_back(std::move(next.second));
  }
  return out;
}

std::vector<int64_t> ParseIntArray(const pqxx::field& field) {
  std::vector<int64_t> out;
  if (field.is_null()) return out;
  absl::string_view text(field.c_str(), field.size());
  if (text.size() < 2) return out;
  text = text.substr(1, text.size() - 2);  // strip { }
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

absl::Status ParseBytea(const pqxx::field& field, absl::string_view what,
                        google::protobuf::MessageLite* message) {
  if (field.is_null()) {
    message->Clear();
    return absl::OkStatus();
  }
  const pqxx::binarystring bytes(field);
  if (!message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InternalError(absl::StrCat("stored ", what, " (", bytes.size(),
                                            " bytes) does not parse as ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobFromRow(const pqxx::row& row) {
  v1::Job job;
  job.set_id(row[0].c_str());
  job.set_tenant(row[1].c_str());
  job.set_name(row[2].c_str());
  job.set_state(static_cast<v1::JobState>(row[3].as<int>()));
  job.set_generation(row[4].as<int64_t>());
  // row[5] num_layers: part of the PTC, not of Job.
  job.set_tensor_count(row[6].as<int>());
  job.set_total_bytes(row[7].as<int64_t>());
  job.set_created_unix_ms(row[8].as<int64_t>());
  job.set_updated_unix_ms(row[9].as<int64_t>());
  if (absl::Status s = ParseBytea(row[10], absl::StrCat("layout of job \"", job.id(), "\""),
                                  job.mutable_layout());
      !s.ok()) {
    return s;
  }
  if (!row[11].is_null()) job.set_active_operation_id(row[11].c_str());
  for (std::string& host : ParseTextArray(row[12])) job.add_lost_hosts(std::move(host));
  if (!row[13].is_null()) job.set_step_boundary_operation_id(row[13].c_str());
  job.set_layout_epoch(row[14].as<int64_t>());
  job.set_version(row[15].as<int64_t>());
  job.set_state_memory(static_cast<v1::StateMemory>(row[16].as<int>()));  // migrations/0019
  // Its elastic policy and the policy's status (migrations/0024).
  if (!row[17].is_null()) {
    if (absl::Status s = ParseBytea(row[17], absl::StrCat("policy of job \"", job.id(), "\""),
                                    job.mutable_policy());
        !s.ok()) {
      return s;
    }
  }
  job.set_policy_status(row[18].c_str());
  return job;
}

absl::StatusOr<v1::Operation> OperationFromRow(const pqxx::row& row,
                                               std::vector<std::string>* lost_hosts,
                                               std::vector<int>* lost_ranks) {
  v1::Operation op;
  op.set_id(row[0].c_str());
  op.set_job_id(row[1].c_str());
  op.set_kind(static_cast<v1::OperationKind>(row[2].as<int>()));
  op.set_state(static_cast<v1::OperationState>(row[3].as<int>()));
  op.set_from_generation(row[4].as<int64_t>());
  op.set_to_generation(row[5].as<int64_t>());
  op.set_error(row[6].c_str());
  if (!row[7].is_null()) {
    if (absl::Status s = ParseBytea(row[7], absl::StrCat("stats of operation \"", op.id(), "\""),
                                    op.mutable_stats());
        !s.ok()) {
      return s;
    }
  }
  op.set_bytes_done(row[8].as<int64_t>());
  op.set_bytes_total(row[9].as<int64_t>());
  op.set_idempotency_key(row[10].c_str());
  op.set_created_unix_ms(row[11].as<int64_t>());
  op.set_updated_unix_ms(row[12].as<int64_t>());
  if (absl::Status s =
          ParseBytea(row[13], absl::StrCat("target layout of operation \"", op.id(), "\""),
                     op.mutable_target_layout());
      !s.ok()) {
    return s;
  }
  if (lost_hosts != nullptr) *lost_hosts = ParseTextArray(row[14]);
  if (lost_ranks != nullptr) {
    lost_ranks->clear();
    for (int64_t r : ParseIntArray(row[15])) lost_ranks->push_back(static_cast<int>(r));
  }
  // Stop-free (migrations/0009): the preparation and the pause apart.
  op.set_stop_free(row[16].as<bool>());
  if (!row[17].is_null()) op.set_prepared_unix_ms(row[17].as<int64_t>());
  if (!row[18].is_null()) op.set_cutover_unix_ms(row[18].as<int64_t>());
  if (!row[19].is_null()) op.set_cutover_operation_id(row[19].c_str());
  // Agents prepare (migrations/0011).
  if (!row[20].is_null()) op.set_workers_prepared_unix_ms(row[20].as<int64_t>());
  if (!row[21].is_null()) op.set_agents_prepared_unix_ms(row[21].as<int64_t>());
  op.set_prepared_from_generation(row[22].as<int64_t>());
  op.set_bytes_precopied(row[23].as<int64_t>());
  op.set_bytes_skipped_unchanged(row[24].as<int64_t>());
  // A checkpoint and an operation that meet (migrations/0013); row[29], the
  // step boundary's timeout, is the store's own.
  if (!row[25].is_null()) op.set_queued_behind_operation_id(row[25].c_str());
  op.set_step_boundary(static_cast<v1::StepBoundary>(row[26].as<int>()));
  op.set_step_boundary_deadline_unix_ms(row[27].as<int64_t>());
  if (!row[28].is_null()) op.set_step_boundary_checkpoint_id(row[28].c_str());
  op.set_version(row[30].as<int64_t>());
  // The cost model's prediction and when it was planned (migrations/0022).
  if (!row[31].is_null()) {
    if (absl::Status s =
            ParseBytea(row[31], absl::StrCat("prediction of operation \"", op.id(), "\""),
                       op.mutable_prediction());
        !s.ok()) {
      return s;
    }
  }
  if (!row[32].is_null()) op.set_planned_unix_ms(row[32].as<int64_t>());
  // The request's deadline (migrations/0023).
  if (const int64_t deadline = row[33].as<int64_t>(); deadline > 0) {
    op.mutable_deadline()->set_unix_ms(deadline);
    op.mutable_deadline()->set_abort_past(row[34].as<bool>());
  }
  SetDerivedFields(&op);
  return op;
}

absl::StatusOr<std::vector<v1::GenerationRef>> GenerationRefsFromRows(const pqxx::result& rows) {
  std::vector<v1::GenerationRef> refs;
  refs.reserve(rows.size());
  for (const pqxx::row& row : rows) {
    v1::GenerationRef ref;
    ref.set_job_id(row[0].c_str());
    ref.set_generation(row[1].as<int64_t>());
    refs.push_back(std::move(ref));
  }
  return refs;
}

absl::StatusOr<v1::Host> HostFromRow(const pqxx::row& row) {
  v1::Host host;
  if (absl::Status s = ParseBytea(row[0], "host info", &host); !s.ok()) return s;
  host.set_state(static_cast<v1::HostState>(row[1].as<int>()));
  host.set_last_heartbeat_unix_ms(row[2].as<int64_t>());
  host.set_lease_expires_unix_ms(row[3].as<int64_t>());
  host.set_leaves_unix_ms(row[4].as<int64_t>());
  return host;
}

std::string PackChecksums(const std::vector<const v1::ShardChecksum*>& checksums) {
  std::string out;
  out.reserve(checksums.size() * kPackedChecksumBytes);
  for (const v1::ShardChecksum* c : checksums) {
    PutLe(static_cast<uint32_t>(c->item()), 4, &out);
    PutLe(c->checksum(), 8, &out);
    PutLe(static_cast<uint64_t>(c->bytes()), 8, &out);
  }
  return out;
}

absl::Status UnpackChecksums(absl::string_view packed, int rank,
                             std::vector<v1::ShardChecksum>* out) {
  if (packed.size() % kPackedChecksumBytes != 0) {
    return absl::InternalError(absl::StrCat("stored checksums of rank ", rank, ": ", packed.size(),
                                            " bytes is not a multiple of ", kPackedChecksumBytes));
  }
  for (size_t off = 0; off < packed.size(); off += kPackedChecksumBytes) {
    const char* p = packed.data() + off;
    v1::ShardChecksum c;
    c.set_item(static_cast<int32_t>(static_cast<uint32_t>(GetLe(p, 4))));
    c.set_rank(rank);
    c.set_checksum(GetLe(p + 4, 8));
    c.set_bytes(static_cast<int64_t>(GetLe(p + 12, 8)));
    out->push_back(std::move(c));
  }
  return absl::OkStatus();
}

}  // namespace reshard::coordinator::pg
