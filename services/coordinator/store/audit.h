// The audit trail's record and the scope that carries it from a gRPC
// handler down to the store transaction that makes the call's effect
// (docs/security.md, "Audit").
//
// A handler of a mutating method opens an AuditScope on its thread; the
// store methods that carry out a mutation on a caller's behalf write the
// scope's record inside their own transaction (PgStore: pg::WriteAudit), so
// the row commits or rolls back with the effect. When the call ends without
// such a committed row (refused, failed, or a no-op), the handler writes the
// record on its own (Store::AppendAudit).
//
// Thread contract: an AuditScope belongs to the thread that opened it (the
// gRPC handler's thread; every store call of one RPC runs on it). Threads
// with no scope (the operation driver, the leader) write no audit rows.
#pragma once

#include <cstdint>
#include <string>

namespace reshard::coordinator {

/// One row of audit_log (migrations/0005_audit.sql).
struct AuditRecord {
  int64_t id = 0;          // set by the store
  int64_t at_unix_ms = 0;  // set by the store (database clock)
  std::string identity;    // "" when the caller was not authenticated
  std::string role;
  std::string tenant;  // "" : the store fills it from job_id / operation_id
  std::string method;
  std::string job_id;  // "" : the store fills it from operation_id
  std::string operation_id;
  std::string target;  // what else the call names: a token id, a host id
  std::string idempotency_key;
  std::string code;     // "OK", "PERMISSION_DENIED", ...
  std::string message;  // a status message, cut to kMaxAuditMessageBytes

  /// Set (by the store) once a transaction that wrote this record committed.
  bool committed = false;
};

/// Longest message kept (UTF-8 safe cut).
inline constexpr size_t kMaxAuditMessageBytes = 512;

/// Makes `record` the current thread's audit record until destroyed.
/// Scopes do not nest (a second one on the same thread is a bug).
class AuditScope {
 public:
  explicit AuditScope(AuditRecord* record);
  ~AuditScope();
  AuditScope(const AuditScope&) = delete;
  AuditScope& operator=(const AuditScope&) = delete;

  /// The current thread's record, or null outside a scope.
  static AuditRecord* Current();
};

}  // namespace reshard::coordinator
