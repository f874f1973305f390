// reshard-client-quickstart: the C++ client end to end, as a scheduler and
// as the training workers of a small job. It registers a job (tp 2, dp 2 on
// two hosts x 2 devices, every tensor data-parallel replicated), publishes
// every rank's tensors to its host's agent, resizes the job onto one host
// (tp 2, dp 1) while printing the operation's progress, then loads the new
// generation and checks that every byte arrived.
//
//   reshard-client-quickstart [--coordinator HOST:PORT (default $RESHARD_COORDINATOR)]
//       --workers host-0=/path/host-0.sock,host-1=/path/host-1.sock,host-2=/path/host-2.sock
//       [--publish-only]
//
// With --publish-only it stops after publishing and prints the job id (for
// trying reshardctl on a job whose state is in place).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cpp/coordinator_client.h"
#include "client/cpp/worker_client.h"

namespace {

using reshard::client::CoordinatorClient;
using reshard::client::WorkerClient;
namespace v1 = reshard::v1;

v1::Layout MakeLayout(int tp, int dp, const std::vector<std::string>& hosts) {
  v1::Layout l;
  l.mutable_config()->set_tp(tp);
  l.mutable_config()->set_pp(1);
  l.mutable_config()->set_dp(dp);
  for (const std::string& h : hosts) l.mutable_placement()->add_hosts(h);
  l.mutable_placement()->set_devices_per_host(2);
  return l;
}

v1::JobSpec Spec(const std::vector<std::string>& hosts) {
  v1::JobSpec spec;
  spec.set_name(absl::StrCat("quickstart-", reshard::client::NewIdempotencyKey().substr(0, 8)));
  spec.set_tenant("examples");
  v1::Ptc* ptc = spec.mutable_ptc();
  ptc->set_num_layers(1);
  for (const char* name : {"layers.0.mlp.weight", "layers.0.norm.weight"}) {
    v1::TensorSpec* t = ptc->add_tensors();
    t->set_name(name);
    t->set_dtype(v1::DTYPE_FLOAT32);
    t->add_shape(256);
    if (std::strstr(name, "mlp") != nullptr) {
      t->add_shape(128);
      t->mutable_partition()->mutable_tp()->set_mode(v1::TP_SPLIT);
    }
    t->mutable_partition()->mutable_pipeline()->set_mode(v1::PIPELINE_LAYER);
  }
  *spec.mutable_layout() = MakeLayout(2, 2, hosts);
  return spec;
}

// What tensor-parallel rank `tp_rank` holds of item `item`: replicas agree
// (only the split mlp weight, item 0, differs between tp ranks).
std::vector<uint8_t> Bytes(size_t size, int item, int tp_rank) {
  if (item != 0) tp_rank = 0;
  std::vector<uint8_t> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(i * 31 + item * 7 + tp_rank);
  return out;
}

int Fail(const absl::Status& s) {
  std::cerr << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("RESHARD_COORDINATOR");
  std::string coordinator = env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
  std::map<std::string, std::string> sockets;  // host -> worker socket
  bool publish_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--coordinator" && i + 1 < argc) {
      coordinator = argv[++i];
    } else if (arg == "--workers" && i + 1 < argc) {
      for (absl::string_view kv : absl::StrSplit(argv[++i], ',')) {
        std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
        sockets[p.first] = p.second;
      }
    } else if (arg == "--publish-only") {
      publish_only = true;
    } else {
      std::cerr << "usage: " << argv[0]
                << " --coordinator HOST:PORT --workers HOST=SOCKET,... [--publish-only]\n";
      return 2;
    }
  }
  std::vector<std::string> hosts;
  for (const auto& [host, socket] : sockets) hosts.push_back(host);
  if (hosts.size() < 2 || (!publish_only && hosts.size() < 3)) {
    std::cerr << "--workers: need 3 hosts (2 with --publish-only)\n";
    return 2;
  }

  // TLS from RESHARD_TLS_CA / RESHARD_TLS_CERT / RESHARD_TLS_KEY (or
  // RESHARD_INSECURE=1), the bearer token from RESHARD_TOKEN.
  CoordinatorClient::Options options;
  options.tls = reshard::TlsFilesFromEnvironment();
  if (const char* token = std::getenv("RESHARD_TOKEN")) options.token = token;
  CoordinatorClient client(coordinator, options);
  v1::RegisterJobRequest reg;
  *reg.mutable_spec() = Spec({hosts[0], hosts[1]});
  absl::StatusOr<v1::Job> job = client.RegisterJob(reg);
  if (!job.ok()) return Fail(job.status());
  std::cout << "registered job " << job->id() << " (" << job->name() << ")\n";
  // The job's workers present its worker token to their agent.
  absl::StatusOr<std::string> token = client.GetWorkerToken(job->id());
  if (!token.ok()) return Fail(token.status());
  WorkerClient::Options worker_options;
  worker_options.token = *token;

  // The workers: every rank publishes its tensors to its host's agent.
  const v1::Layout& old_layout = reg.spec().layout();
  for (int rank = 0; rank < 4; ++rank) {
    WorkerClient worker(sockets[old_layout.placement().hosts(rank / 2)], worker_options);
    absl::StatusOr<reshard::client::ShardWriter> shard = worker.BeginPublish(job->id(), 1, rank);
    if (!shard.ok()) return Fail(shard.status());
    for (size_t i = 0; i < shard->items().size(); ++i) {  // written in place
      absl::Span<uint8_t> dst = shard->item_data(i);
      const std::vector<uint8_t> src = Bytes(dst.size(), static_cast<int>(i), rank % 2);
      std::memcpy(dst.data(), src.data(), src.size());
    }
    absl::StatusOr<std::vector<uint64_t>> sums = shard->Seal();
    if (!sums.ok()) return Fail(sums.status());
  }
  std::cout << "published generation 1 (tp 2, dp 2 on " << hosts[0] << ", " << hosts[1] << ")\n";
  if (publish_only) {
    std::cout << job->id() << "\n";
    return 0;
  }

  // The scheduler: tp 2, dp 1 on the third host.
  const v1::Layout target = MakeLayout(2, 1, {hosts[2]});
  v1::ResizeRequest resize;
  resize.set_job_id(job->id());
  resize.set_expected_generation(job->generation());
  *resize.mutable_placement() = target.placement();
  *resize.mutable_config() = target.config();
  absl::StatusOr<v1::Operation> op = client.Resize(resize);
  if (!op.ok()) return Fail(op.status());
  absl::StatusOr<v1::Operation> done = client.WatchOperation(op->id(), [](const v1::Operation& o) {
    std::cout << "  " << v1::OperationState_Name(o.state()) << " " << o.bytes_done() << " / "
              << o.bytes_total() << " bytes\n";
  });
  if (!done.ok()) return Fail(done.status());
  if (done->state() != v1::OPERATION_STATE_COMMITTED) {
    std::cerr << "operation " << done->id() << " ended " << v1::OperationState_Name(done->state())
              << ": " << done->error() << "\n";
    return 3;
  }

  // The workers of the new layout load generation 2 and check every byte.
  WorkerClient worker(sockets[hosts[2]], worker_options);
  for (int rank = 0; rank < 2; ++rank) {
    absl::StatusOr<reshard::client::LoadedShard> shard =
        worker.Load(job->id(), done->to_generation(), rank);
    if (!shard.ok()) return Fail(shard.status());
    for (size_t i = 0; i < shard->items().size(); ++i) {
      absl::Span<const uint8_t> got = shard->item_data(i);
      const std::vector<uint8_t> want = Bytes(got.size(), static_cast<int>(i), rank % 2);
      if (std::memcmp(got.data(), want.data(), got.size()) != 0) {
        std::cerr << "rank " << rank << " item " << shard->items()[i].name << " differs\n";
        return 1;
      }
    }
  }
  std::cout << "generation " << done->to_generation() << " on " << hosts[2]
            << ": every byte verified\n";
  return 0;
}
