#include "services/coordinator/store/audit.h"

#include "common/log.h"

namespace reshard::coordinator {
namespace {
thread_local AuditRecord* current_record = nullptr;
}  // namespace

AuditScope::AuditScope(AuditRecord* record) {
  RESHARD_CHECK(current_record == nullptr) << "AuditScope opened twice on one thread";
  current_record = record;
}

AuditScope::~AuditScope() { current_record = nullptr; }

AuditRecord* AuditScope::Current() { return current_record; }

}  // namespace reshard::coordinator
