#include "agent/executor/step_seal.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/executor/item_hash.h"
#include "agent/executor/peer_proof.h"
#include "agent/executor/transfer_tags.h"
#include "common/log.h"

namespace reshard::agent {
namespace {

constexpr size_t kDigestBytes = 32;
constexpr size_t kMacBytes = 32;

std::string Int64Field(int64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)));
  return out;
}

int64_t ReadInt64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(s[at + i]);
  return static_cast<int64_t>(v);
}

std::string SealMac(const std::string& secret, const std::string& operation_id,
                    const std::string& sender, const std::string& receiver, int64_t step,
                    int64_t bytes, const std::string& digest) {
  std::string data;
  AppendMacField(data, "reshard-step-seal-v1");
  AppendMacField(data, operation_id);
  AppendMacField(data, sender);
  AppendMacField(data, receiver);
  AppendMacField(data, Int64Field(step));
  AppendMacField(data, Int64Field(bytes));
  AppendMacField(data, digest);
  return HmacSha256Of(secret, data);
}

// OpenSSL's Poly1305, fetched once (thread-safe: a fetched EVP_MAC is shared).
EVP_MAC* Poly1305() {
  static EVP_MAC* mac = [] {
    EVP_MAC* m = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
    RESHARD_CHECK(m != nullptr) << "OpenSSL has no POLY1305";
    return m;
  }();
  return mac;
}

}  // namespace

std::string ChunkKey(const std::string& secret, const std::string& operation_id, int64_t step,
                     int64_t chunk) {
  std::string data;
  AppendMacField(data, "reshard-chunk-key-v1");
  AppendMacField(data, operation_id);
  AppendMacField(data, Int64Field(step));
  AppendMacField(data, Int64Field(chunk));
  return HmacSha256Of(secret, data);
}

ChunkTag ChunkTagOf(const std::string& key, const void* data, size_t bytes) {
  return ChunkTagOf(key, data, bytes, nullptr);
}

ChunkTag ChunkTagOf(const std::string& key, const void* data, size_t bytes,
                    const std::function<void(size_t, const uint8_t*, size_t)>& also) {
  RESHARD_CHECK(key.size() == 32);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(Poly1305());
  RESHARD_CHECK(ctx != nullptr);
  ChunkTag tag{};
  size_t out = 0;
  bool ok =
      EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), nullptr);
  if (!also) {
    ok = ok && EVP_MAC_update(ctx, static_cast<const unsigned char*>(data), bytes);
  } else {
    ForEachBlock(data, bytes, [&](size_t offset, const uint8_t* block, size_t n) {
      ok = ok && EVP_MAC_update(ctx, block, n);
      also(offset, block, n);
    });
  }
  ok = ok && EVP_MAC_final(ctx, tag.data(), &out, tag.size());
  EVP_MAC_CTX_free(ctx);
  RESHARD_CHECK(ok && out == tag.size()) << "Poly1305 failed";
  return tag;
}

std::string StepDigest(const std::vector<ChunkTag>& tags) {
  std::string all;
  all.reserve(tags.size() * sizeof(ChunkTag));
  for (const ChunkTag& t : tags) all.append(reinterpret_cast<const char*>(t.data()), t.size());
  return Sha256Of(all);
}

std::string MakeStepSeal(const std::string& secret, const std::string& operation_id,
                         const std::string& sender, const std::string& receiver, int64_t step,
                         int64_t bytes, const std::string& digest) {
  RESHARD_CHECK(digest.size() == kDigestBytes);
  std::string out = Int64Field(step) + Int64Field(bytes) + digest;
  out += SealMac(secret, operation_id, sender, receiver, step, bytes, digest);
  RESHARD_CHECK(out.size() == kStepSealBytes);
  return out;
}

absl::StatusOr<SealContents> CheckStepSeal(const std::string& secret,
                                           const std::string& operation_id,
                                           const std::string& sender, const std::string& receiver,
                                           int64_t step, const std::string& message) {
  if (message.size() != kStepSealBytes) {
    return absl::DataLossError(absl::StrCat("the seal of step ", step, " from host \"", sender,
                                            "\" has ", message.size(), " bytes, not ",
                                            kStepSealBytes));
  }
  const int64_t named = ReadInt64(message, 0);
  SealContents c;
  c.bytes = ReadInt64(message, 8);
  c.digest = message.substr(16, kDigestBytes);
  const std::string mac = message.substr(16 + kDigestBytes, kMacBytes);
  if (named != step || !ConstantTimeEqual(mac, SealMac(secret, operation_id, sender, receiver, step,
                                                       c.bytes, c.digest))) {
    return absl::DataLossError(absl::StrCat(
        "the seal of step ", step, " from host \"", sender,
        "\" does not check under the operation's transfer secret (forged, or altered in flight)"));
  }
  return c;
}

// What transport callbacks may touch; outlives the StepSeals.
struct StepSeals::Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> received;  // per step; sized before any receive
  std::vector<bool> received_done;
  std::vector<absl::Status> received_status;
  std::vector<std::string> sent;  // seals being sent
  size_t sends_done = 0;
  absl::Status send_error;
};

StepSeals::StepSeals(Transport* transport, std::string secret, std::string operation_id,
                     std::string job_id, std::string host_id, uint32_t tag_key,
                     std::vector<Step> steps)
    : transport_(transport),
      secret_(std::move(secret)),
      operation_id_(std::move(operation_id)),
      job_id_(std::move(job_id)),
      host_id_(std::move(host_id)),
      tag_key_(tag_key),
      steps_(std::move(steps)),
      shared_(std::make_shared<Shared>()) {
  tags_.resize(steps_.size());
  added_.resize(steps_.size());
  bytes_.assign(steps_.size(), 0);
  for (size_t s = 0; s < steps_.size(); ++s) {
    RESHARD_CHECK(steps_[s].chunks >= 0 && steps_[s].chunks <= kMaxDataChunksPerStep);
    tags_[s].resize(steps_[s].chunks);
    added_[s].assign(steps_[s].chunks, false);
  }
  shared_->received.assign(steps_.size(), std::string());
  shared_->received_done.assign(steps_.size(), false);
  shared_->received_status.assign(steps_.size(), absl::OkStatus());
}

StepSeals::~StepSeals() = default;

void StepSeals::PostReceives() {
  RESHARD_CHECK(!received_posted_);
  received_posted_ = true;
  for (size_t s = 0; s < steps_.size(); ++s) {
    if (steps_[s].is_send) continue;
    shared_->received[s].assign(kStepSealBytes, '\0');
    // Checked in PrepareHostSteps: a cross-host step index fits a tag.
    const uint64_t tag = SealTag(tag_key_, steps_[s].index).value();
    transport_->Receive(tag, shared_->received[s].data(), kStepSealBytes,
                        [shared = shared_, s](absl::Status status) {
                          std::lock_guard<std::mutex> l(shared->mu);
                          shared->received_status[s] = std::move(status);
                          shared->received_done[s] = true;
                          shared->cv.notify_all();
                        });
  }
}

void StepSeals::AddChunk(size_t s, int64_t chunk, const void* data, size_t bytes) {
  AddChunk(s, chunk, data, bytes, nullptr);
}

void StepSeals::AddChunk(
    size_t s, int64_t chunk, const void* data, size_t bytes,
    const std::function<void(size_t offset, const uint8_t* block, size_t n)>& also) {
  RESHARD_CHECK(s < steps_.size() && chunk >= 0 && chunk < steps_[s].chunks);
  RESHARD_CHECK(!added_[s][chunk]);
  tags_[s][chunk] =
      ChunkTagOf(ChunkKey(secret_, operation_id_, steps_[s].index, chunk), data, bytes, also);
  added_[s][chunk] = true;
  bytes_[s] += static_cast<int64_t>(bytes);
}

void StepSeals::SendSeals() {
  RESHARD_CHECK(!sent_);
  sent_ = true;
  std::vector<size_t> sends;
  {
    std::lock_guard<std::mutex> l(shared_->mu);
    for (size_t s = 0; s < steps_.size(); ++s) {
      if (!steps_[s].is_send) continue;
      for (int64_t c = 0; c < steps_[s].chunks; ++c) RESHARD_CHECK(added_[s][c]);
      shared_->sent.push_back(MakeStepSeal(secret_, operation_id_, host_id_, steps_[s].peer,
                                           steps_[s].index, bytes_[s], StepDigest(tags_[s])));
      sends.push_back(s);
    }
  }
  // `sent` is not resized any more: its strings stay where they are.
  for (size_t k = 0; k < sends.size(); ++k) {
    const Step& step = steps_[sends[k]];
    const uint64_t tag = SealTag(tag_key_, step.index).value();
    transport_->Send(step.peer, tag, shared_->sent[k].data(), kStepSealBytes,
                     [shared = shared_, index = step.index, peer = step.peer](absl::Status s) {
                       std::lock_guard<std::mutex> l(shared->mu);
                       if (!s.ok() && shared->send_error.ok()) {
                         shared->send_error = absl::Status(
                             s.code(), absl::StrCat("sending the seal of step ", index,
                                                    " to host \"", peer, "\": ", s.message()));
                       }
                       ++shared->sends_done;
                       shared->cv.notify_all();
                     });
  }
}

absl::Status StepSeals::Finish(const std::function<bool()>& cancelled, PeerWaitBudget timeout) {
  RESHARD_CHECK(received_posted_ && sent_);
  const PeerWait wait(timeout);
  {
    std::unique_lock<std::mutex> l(shared_->mu);
    while (true) {
      if (!shared_->send_error.ok()) return shared_->send_error;
      bool all = shared_->sends_done == shared_->sent.size();
      for (size_t s = 0; s < steps_.size() && all; ++s) {
        all = steps_[s].is_send || shared_->received_done[s];
      }
      if (all) break;
      if (cancelled && cancelled()) {
        return absl::CancelledError(
            absl::StrCat("operation ", operation_id_, " cancelled while waiting for step seals"));
      }
      if (wait.Expired()) {
        for (size_t s = 0; s < steps_.size(); ++s) {
          if (steps_[s].is_send || shared_->received_done[s]) continue;
          return absl::DeadlineExceededError(absl::StrCat(
              "job \"", job_id_, "\" operation ", operation_id_, ": host \"", host_id_,
              "\" got no seal of step ", steps_[s].index, " (", steps_[s].what, ") from host \"",
              steps_[s].peer, "\" within ", wait.Waited(),
              " (its sender failed or never finished): the bytes received are not committed"));
        }
        return absl::DeadlineExceededError(
            absl::StrCat("operation ", operation_id_, ": host \"", host_id_,
                         "\": the step seals sent were not delivered within ", wait.Waited()));
      }
      shared_->cv.wait_for(l, std::chrono::milliseconds(100));
    }
  }
  // Every transfer of the seals is over: nothing writes `received` now.
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& step = steps_[s];
    if (step.is_send) continue;
    const std::string where = absl::StrCat("job \"", job_id_, "\" ", step.what, " step ",
                                           step.index, " from source host \"", step.peer, "\"");
    if (const absl::Status& st = shared_->received_status[s]; !st.ok()) {
      return absl::Status(st.code(), absl::StrCat(where, ": receiving its seal: ", st.message()));
    }
    for (int64_t c = 0; c < step.chunks; ++c) RESHARD_CHECK(added_[s][c]);
    absl::StatusOr<SealContents> seal = CheckStepSeal(secret_, operation_id_, step.peer, host_id_,
                                                      step.index, shared_->received[s]);
    if (!seal.ok()) {
      return absl::DataLossError(absl::StrCat(where, ": ", seal.status().message(),
                                              "; the bytes received are not committed"));
    }
    if (seal->bytes != bytes_[s] || !ConstantTimeEqual(seal->digest, StepDigest(tags_[s]))) {
      return absl::DataLossError(absl::StrCat(
          where, ": the ", bytes_[s], " bytes received differ from the ", seal->bytes,
          " bytes the source sent (digest ",
          absl::BytesToHexString(StepDigest(tags_[s]).substr(0, 8)), ", sealed by the source ",
          absl::BytesToHexString(seal->digest.substr(0, 8)),
          "): altered in flight or sent by another process; the bytes received are not committed"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<StepSeals> PlanStepSeals(Transport* transport, const v1::HostTask& task,
                                         const std::string& host_id,
                                         const std::vector<RemoteStep>& remotes,
                                         const std::vector<int64_t>& chunk_counts) {
  if (task.transfer_secret().empty()) return nullptr;
  std::vector<StepSeals::Step> steps;
  for (size_t i = 0; i < remotes.size(); ++i) {
    const RemoteStep& r = remotes[i];
    const int item = r.step->item();
    steps.push_back(StepSeals::Step{
        r.step->index(), r.is_send, r.peer, chunk_counts[i],
        absl::StrCat("item ", item, " (\"", task.plan().items(item).name(), "\")")});
  }
  auto seals =
      std::make_unique<StepSeals>(transport, task.transfer_secret(), TransferContext(task),
                                  task.job_id(), host_id, TaskTagKey(task), std::move(steps));
  seals->PostReceives();
  return seals;
}

absl::Status FinishStepSeals(StepSeals& seals, const TaskExecutor::Options& options,
                             const std::function<bool()>& cancelled,
                             const std::function<void(const std::string& what)>& waiting) {
  if (waiting) waiting("step seals");
  seals.SendSeals();
  return seals.Finish(cancelled, PeerWaitBudget(std::chrono::milliseconds(options.seal_timeout_ms),
                                                options.coordinator_reach));
}

}  // namespace reshard::agent
