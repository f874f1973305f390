// Whose call the store is serving on this thread. The PostgreSQL pool keeps
// a share of its connections that only agent-class calls may take
// (PgStoreOptions::agent_reserve), so that heartbeats, progress reports and
// task calls never wait for a connection behind client calls (watch streams,
// GetJob floods). The gRPC adapter of the agent service and the leader's
// thread mark their calls; every other thread's calls are client calls.
//
// Thread contract: the class is per thread; CallClassScope is used on the
// thread that made it.
#pragma once

namespace reshard::coordinator {

enum class CallClass {
  kClient,  // schedulers, viewers, workers, operators: the default
  kAgent,   // agents (heartbeats, progress, tasks) and the leader's driver
};

/// The class of this thread's store calls now.
CallClass CurrentCallClass();

/// Marks this thread's store calls as `call_class` for the scope's lifetime,
/// then restores the class it found. Not copyable; nests.
class CallClassScope {
 public:
  explicit CallClassScope(CallClass call_class);
  ~CallClassScope();
  CallClassScope(const CallClassScope&) = delete;
  CallClassScope& operator=(const CallClassScope&) = delete;

 private:
  CallClass previous_;
};

}  // namespace reshard::coordinator
