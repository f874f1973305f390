#include "services/coordinator/store/call_class.h"

namespace reshard::coordinator {
namespace {

thread_local CallClass current_call_class = CallClass::kClient;

}  // namespace

CallClass CurrentCallClass() { return current_call_class; }

CallClassScope::CallClassScope(CallClass call_class) : previous_(current_call_class) {
  current_call_class = call_class;
}

CallClassScope::~CallClassScope() { current_call_class = previous_; }

}  // namespace reshard::coordinator
