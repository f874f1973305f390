#include "agent/executor/device_cross_host.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/executor/transfer_tags.h"

namespace reshard::agent {
namespace {

std::map<std::string, int> HostIndex(const std::string& host_id, const v1::HostTask& task) {
  std::vector<std::string> hosts{host_id};
  for (const v1::PeerHost& p : task.peers()) {
    if (p.host_id() != host_id) hosts.push_back(p.host_id());
  }
  std::sort(hosts.begin(), hosts.end());
  std::map<std::string, int> index;
  for (size_t i = 0; i < hosts.size(); ++i) index[hosts[i]] = static_cast<int>(i);
  return index;
}

}  // namespace

DeviceCrossHostSteps::DeviceCrossHostSteps(
    DeviceBufferStore& devices, Transport* transport, const TaskExecutor::Options& options,
    const std::string& host_id, const v1::HostTask& task, const std::function<bool()>& cancelled,
    const std::function<void(const std::string& what)>& waiting)
    : devices_(devices),
      api_(devices.api()),
      transport_(transport),
      options_(options),
      host_id_(host_id),
      task_(task),
      cancelled_(cancelled),
      waiting_(waiting),
      tag_key_(TaskTagKey(task)),
      host_index_(HostIndex(host_id, task)) {}

DeviceStepsMover::DeviceStepsMover(Transport* transport, const std::function<bool()>& run_cancelled)
    : transport_(transport), cancelled_([cancel = cancel_, run_cancelled] {
        return cancel->load() || (run_cancelled && run_cancelled());
      }) {}

absl::Status DeviceStepsMover::Prepare(const std::string& host_id, const v1::HostTask& task,
                                       const std::function<bool()>& cancelled) {
  if (transport_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("operation ", task.operation_id(), " has cross-host steps and no transport"));
  }
  return ConnectTaskPeers(transport_, host_id, task, cancelled);
}

void DeviceStepsMover::Post(uint64_t id, MoverTransfer t) { posted_.emplace(id, std::move(t)); }

void DeviceStepsMover::Poll(std::chrono::steady_clock::duration /*wait*/,
                            std::deque<MoverCompletion>* out) {
  if (!posted_.has_value()) return;
  auto [id, t] = *std::move(posted_);
  posted_.reset();
  absl::Status s;
  if (t.steps == nullptr || t.made == nullptr) {
    s = absl::InvalidArgumentError(
        absl::StrCat(capabilities().name, " moves a run's cross-host steps, not a chunk"));
  } else if (cancel_->load()) {
    s = absl::CancelledError("task cancelled");
  } else {
    const std::function<void(int64_t)> landed =
        t.landed ? t.landed : std::function<void(int64_t)>([](int64_t) {});
    s = steps_->Move(*t.steps, *t.made, landed);
    if (!s.ok() && cancel_->load() && !absl::IsCancelled(s)) {
      s = absl::CancelledError(absl::StrCat("task cancelled (", s.message(), ")"));
    }
  }
  out->emplace_back(id, std::move(s));
}

void DeviceStepsMover::Cancel(uint64_t tag, uint64_t mask) {
  cancel_->store(true);
  if (steps_ != nullptr) steps_->Abort();
  if (transport_ != nullptr) transport_->CancelTags(tag, mask);
}

}  // namespace reshard::agent
