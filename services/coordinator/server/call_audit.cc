#include "services/coordinator/server/call_audit.h"

#include <string>

#include "services/coordinator/logic/audit_api.h"

namespace reshard::coordinator {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// The string field `name` of `m`, or "" when it has none.
std::string StringField(const Message& m, const char* name) {
  const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  if (f == nullptr || f->is_repeated() || f->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
    return "";
  }
  return m.GetReflection()->GetString(m, f);
}

// The message field `name` of `m`, or null when it has none (or it is unset).
const Message* MessageField(const Message& m, const char* name) {
  const FieldDescriptor* f = m.GetDescriptor()->FindFieldByName(name);
  if (f == nullptr || f->is_repeated() || f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE ||
      !m.GetReflection()->HasField(m, f)) {
    return nullptr;
  }
  return &m.GetReflection()->GetMessage(m, f);
}

// What the request names, by the field names the protos share.
void FillFromRequest(const Message& request, AuditRecord* r) {
  r->job_id = StringField(request, "job_id");
  r->operation_id = StringField(request, "operation_id");
  r->idempotency_key = StringField(request, "idempotency_key");
  r->target = StringField(request, "token_id");                        // RevokeToken
  if (r->target.empty()) r->target = StringField(request, "host_id");  // agent calls
  if (const Message* spec = MessageField(request, "spec")) {           // RegisterJob
    r->tenant = StringField(*spec, "tenant");
    r->target = StringField(*spec, "name");
  }
  if (const Message* host = MessageField(request, "host")) {  // RegisterAgent
    r->target = StringField(*host, "host_id");
  }
}

}  // namespace

CallAudit::CallAudit(const Authorizer& authorizer, const char* method, const Message& request)
    : api_(authorizer.audit()), level_(Authorizer::AuditOf(method)) {
  if (api_ == nullptr || level_ == AuditLevel::kNone) return;
  record_.method = method;
  FillFromRequest(request, &record_);
  // Only a mutation's own transaction writes the record (store/audit.h).
  if (level_ == AuditLevel::kEveryCall) scope_.emplace(&record_);
}

void CallAudit::SetCaller(const Principal& principal) {
  record_.identity = principal.name;
  record_.role = RoleName(principal.role);
}

absl::Status CallAudit::Finish(absl::Status status) {
  if (api_ == nullptr || level_ == AuditLevel::kNone) return status;
  // A refusal the caller hears as NOT_FOUND is audited as what it is.
  const auto hidden = status.GetPayload(kHiddenRefusalPayload);  // absl::optional<Cord>
  const absl::Status audited =
      hidden.has_value() ? absl::PermissionDeniedError(std::string(*hidden)) : status;
  if (level_ == AuditLevel::kRefusals && !absl::IsUnauthenticated(audited) &&
      !absl::IsPermissionDenied(audited)) {
    return status;
  }
  scope_.reset();
  api_->Finish(record_, audited);
  return status;
}

}  // namespace reshard::coordinator
