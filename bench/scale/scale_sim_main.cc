// reshard_scale_sim: a reconfiguration's time at scale, by simulation
// (cost/scale_sim.h; docs/scheduler.md, "At scale"). Plans the move with the
// planner, as the coordinator does, and runs it GPU by GPU on a topology
// file with max-min fair sharing of every link, for the physical bound
// (GPU-direct) and for today's data plane (host memory through the agents,
// at their measured CPU per byte).
//
//   reshard_scale_sim [--quick] [--topology FILE]...
//       the 70B table: tp 8 -> 4 at 1,024 GPUs, and an HSDP host loss
//       recovered from the replicas (onto a spare, onto the survivors).
//   reshard_scale_sim --ptc FILE --from FILE --to FILE [--lost HOST]...
//                     --topology FILE [--plane direct|host-staged|host-memory]
//                     [--set KEY=VALUE]... [--json]
//       one real job's move (binary v1.Ptc and v1.Layout files).
//
// Exits 2 on bad input, 1 when a plan fails.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "bench/planner/gpt_model.h"
#include "cost/scale_sim.h"
#include "cost/topology.h"
#include "planner/layout.h"
#include "planner/planner.h"
#include "planner/validate.h"

namespace reshard::bench {
namespace {

using cost::DataPlane;
using cost::ScaleResult;
using cost::Topology;

struct Args {
  bool quick = false, json = false;
  std::vector<std::string> topologies;
  std::string ptc, from, to, plane = "host-staged";
  std::vector<std::string> lost, sets;
};

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}

// The topology in `path` with `sets` (KEY=VALUE) appended as lines: a later
// key may not repeat an earlier one, so a set replaces the file's line.
absl::StatusOr<Topology> LoadTopology(const std::string& path,
                                      const std::vector<std::string>& sets) {
  std::string text;
  if (!ReadFile(path, &text)) {
    return absl::NotFoundError(absl::StrCat("--topology: cannot read \"", path, "\""));
  }
  for (const std::string& set : sets) {
    const size_t eq = set.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--set: \"", set, "\" is not KEY=VALUE"));
    }
    const std::string key = set.substr(0, eq);
    std::istringstream lines(text);
    std::string kept, line;
    while (std::getline(lines, line)) {
      const size_t start = line.find_first_not_of(" \t");
      const bool same = start != std::string::npos && line.compare(start, key.size(), key) == 0 &&
                        line.size() > start + key.size() &&
                        (line[start + key.size()] == ' ' || line[start + key.size()] == '\t');
      kept += same ? "#" + line + "\n" : line + "\n";
    }
    text = kept + key + " " + set.substr(eq + 1) + "\n";
  }
  absl::StatusOr<Topology> t = cost::ParseTopology(text);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  return t;
}

std::string Seconds(double s) {
  return s >= 100 ? absl::StrFormat("%.0f", s)
         : s >= 1 ? absl::StrFormat("%.2f", s)
                  : absl::StrFormat("%.3f", s);
}

struct Row {
  std::string what, plane;
  ScaleResult r;
};

void PrintTable(const std::vector<Row>& rows) {
  std::printf("  %-44s %-12s %9s %8s %8s %8s %8s %8s %8s  %s\n", "case", "data plane", "cross GB",
              "publish", "move", "check", "load", "total s", "bound s", "move's critical resource");
  for (const Row& row : rows) {
    const ScaleResult& r = row.r;
    std::printf("  %-44s %-12s %9.1f %8s %8s %8s %8s %8s %8s  %s%s\n", row.what.c_str(),
                row.plane.c_str(), r.bytes_cross_host / 1e9, Seconds(r.publish.seconds).c_str(),
                Seconds(r.move.seconds).c_str(), Seconds(r.check.seconds).c_str(),
                Seconds(r.load.seconds).c_str(), Seconds(r.total_seconds).c_str(),
                Seconds(r.move.bound_seconds).c_str(), r.move.critical.c_str(),
                r.cut_short ? " (cut short)" : "");
  }
}

const char* PlaneName(DataPlane p) {
  switch (p) {
    case DataPlane::kDirect:
      return "direct";
    case DataPlane::kHostStaged:
      return "host-staged";
    case DataPlane::kHostMemory:
      return "host-memory";
  }
  return "?";
}

bool ParsePlane(const std::string& s, DataPlane* out) {
  for (DataPlane p : {DataPlane::kDirect, DataPlane::kHostStaged, DataPlane::kHostMemory}) {
    if (s == PlaneName(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

struct Case {
  std::string what;
  const v1::Ptc* ptc;
  v1::Layout from, to;
  planner::LostSet lost;
};

// `layout` (compact placement) with host `gone` replaced by `by`, or left
// out (`by` empty: the hosts after it move up).
v1::Layout Without(v1::Layout layout, const std::string& gone, const std::string& by) {
  v1::Placement* p = layout.mutable_placement();
  std::vector<std::string> hosts(p->hosts().begin(), p->hosts().end());
  p->clear_hosts();
  for (const std::string& h : hosts) {
    if (h != gone) {
      p->add_hosts(h);
    } else if (!by.empty()) {
      p->add_hosts(by);
    }
  }
  return layout;
}

planner::LostSet LostHost(const v1::Layout& from, const std::string& host) {
  planner::LostSet lost;
  lost.hosts = {host};
  const std::vector<v1::DeviceSlot> slots = planner::ExpandPlacement(from.placement());
  for (size_t r = 0; r < slots.size(); ++r) {
    if (slots[r].host() == host) lost.ranks.push_back(static_cast<int>(r));
  }
  return lost;
}

int Table(const Args& a) {
  std::vector<std::string> paths = a.topologies;
  if (paths.empty()) {
    paths = {absl::StrCat(RESHARD_SOURCE_DIR, "/bench/scale/h100_rail.topo"),
             absl::StrCat(RESHARD_SOURCE_DIR, "/bench/scale/h100_fat_tree.topo")};
  }
  // --quick (CI): the same model at 128 GPUs on 16 hosts.
  const int hosts = a.quick ? 16 : 128, shard = a.quick ? 4 : 16;
  const v1::Ptc gpt = BuildGptPtc(kGpt70b, 8);
  // A rank's RNG state is drawn again from the job's seed when no replica
  // holds it (BlobSpec.regenerable), as reshard's PyTorch jobs declare it.
  v1::Ptc fsdp = BuildFsdpGptPtc(kGpt70b, 8);
  for (v1::BlobSpec& b : *fsdp.mutable_blobs()) {
    if (b.scope() == v1::BLOB_PER_RANK) b.set_regenerable(true);
  }
  const v1::Layout hsdp = WithDpShard(MakeLayout(8, 1, hosts, "host-", 0, 8), shard);
  const std::string spare = absl::StrCat("host-", hosts);
  // One replica fewer: host-5's replica leaves, the others keep their hosts.
  v1::Layout survivors = WithDpShard(MakeLayout(8, 1, hosts - shard, "host-", 0, 8), shard);
  survivors.mutable_placement()->clear_hosts();
  for (int h = 0; h < hosts; ++h) {
    if (h / shard != 5 / shard) survivors.mutable_placement()->add_hosts(absl::StrCat("host-", h));
  }
  double state_bytes = 0;
  for (const v1::TensorSpec& t : fsdp.tensors()) {
    double n = planner::ElementBytes(t.dtype());
    for (int64_t d : t.shape()) n *= static_cast<double>(d);
    state_bytes += n;
  }
  std::vector<Case> cases = {
      {absl::StrFormat("70B tp 8->4, %d GPUs", hosts * 8),
       &gpt,
       MakeLayout(8, 1, hosts, "host-", 0, 8),
       MakeLayout(4, 1, 2 * hosts, "host-", 0, 8),
       {}},
      {absl::StrFormat("70B HSDP tp 8->4, %d GPUs", hosts * 8),
       &fsdp,
       hsdp,
       WithDpShard(MakeLayout(4, 1, 2 * hosts, "host-", 0, 8), 2 * shard),
       {}},
      {"70B HSDP, host-5 lost -> a spare", &fsdp, hsdp, Without(hsdp, "host-5", spare),
       LostHost(hsdp, "host-5")},
      {absl::StrFormat("70B HSDP, host-5 lost -> %d replicas", hosts / shard - 1), &fsdp, hsdp,
       survivors, LostHost(hsdp, "host-5")},
  };
  std::printf(
      "reshard_scale_sim: a 70B GPT's full training state (%d layers, hidden %lld; 16-bit "
      "weights, fp32 master weights and Adam moments: %.0f GB), HSDP as %d replicas of %d "
      "hosts\n",
      kGpt70b.layers, static_cast<long long>(kGpt70b.hidden), state_bytes / 1e9, hosts / shard,
      shard);
  int rc = 0;
  for (const std::string& path : paths) {
    absl::StatusOr<Topology> t = LoadTopology(path, a.sets);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      return 2;
    }
    std::printf("\n== %s\n   %s\n", path.substr(path.rfind('/') + 1).c_str(),
                cost::Describe(*t).c_str());
    std::vector<Row> rows;
    for (const Case& c : cases) {
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<planner::Plan> plan = planner::MakePlan(*c.ptc, c.from, c.to, c.lost);
      const double plan_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!plan.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.what.c_str(), plan.status().ToString().c_str());
        rc = 1;
        continue;
      }
      for (DataPlane p : {DataPlane::kDirect, DataPlane::kHostStaged}) {
        const auto s0 = std::chrono::steady_clock::now();
        absl::StatusOr<ScaleResult> r = cost::SimulateScale(*plan, c.from, c.to, *t, p);
        const double sim_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0)
                .count();
        if (!r.ok()) {
          std::fprintf(stderr, "%s: %s\n", c.what.c_str(), r.status().ToString().c_str());
          return 2;
        }
        rows.push_back({c.what, PlaneName(p), *r});
        if (p == DataPlane::kDirect) {
          std::printf("   %s: planned in %.0f ms (%lld steps), simulated in %.0f ms (%d flows)\n",
                      c.what.c_str(), plan_ms, static_cast<long long>(plan->TotalSteps()), sim_ms,
                      r->flows);
        }
      }
    }
    PrintTable(rows);
  }
  return rc;
}

int One(const Args& a) {
  std::string text;
  v1::Ptc ptc;
  v1::Layout from, to;
  const std::pair<const std::string*, google::protobuf::Message*> files[] = {
      {&a.ptc, &ptc}, {&a.from, &from}, {&a.to, &to}};
  for (const auto& [path, msg] : files) {
    if (!ReadFile(*path, &text) || !msg->ParseFromString(text)) {
      std::fprintf(stderr, "cannot read a binary %s from \"%s\"\n",
                   msg->GetDescriptor()->full_name().c_str(), path->c_str());
      return 2;
    }
  }
  DataPlane plane;
  if (!ParsePlane(a.plane, &plane)) {
    std::fprintf(stderr, "--plane: \"%s\" is not direct, host-staged or host-memory\n",
                 a.plane.c_str());
    return 2;
  }
  if (a.topologies.size() != 1) {
    std::fprintf(stderr, "--topology: give exactly one with --ptc\n");
    return 2;
  }
  absl::StatusOr<Topology> t = LoadTopology(a.topologies[0], a.sets);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
    return 2;
  }
  planner::LostSet lost;
  for (const std::string& h : a.lost) {
    const planner::LostSet one = LostHost(from, h);
    lost.hosts.push_back(h);
    lost.ranks.insert(lost.ranks.end(), one.ranks.begin(), one.ranks.end());
  }
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(ptc, from, to, lost);
  if (!plan.ok()) {
    std::fprintf(stderr, "plan: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<ScaleResult> r = cost::SimulateScale(*plan, from, to, *t, plane);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", std::string(r.status().message()).c_str());
    return 2;
  }
  if (a.json) {
    const auto phase = [](const cost::PhaseTime& p) {
      return absl::StrFormat(R"({"seconds": %.6f, "bound_seconds": %.6f, "critical": "%s"})",
                             p.seconds, p.bound_seconds, p.critical);
    };
    std::fputs(
        absl::StrFormat(
            R"({"plane": "%s", "bytes_cross_host": %lld, "bytes_local": %lld, "publish": %s, )"
            R"("move": %s, "check": %s, "load": %s, "overhead_seconds": %.6f, )"
            R"("total_seconds": %.6f, "flows": %d, "cut_short": %s})"
            "\n",
            PlaneName(plane), static_cast<long long>(r->bytes_cross_host),
            static_cast<long long>(r->bytes_local), phase(r->publish), phase(r->move),
            phase(r->check), phase(r->load), r->overhead_seconds, r->total_seconds, r->flows,
            r->cut_short ? "true" : "false")
            .c_str(),
        stdout);
    return 0;
  }
  std::printf("%s\n", cost::Describe(*t).c_str());
  PrintTable({{"the job's move", PlaneName(plane), *r}});
  return 0;
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") {
      a.quick = true;
    } else if (arg == "--json") {
      a.json = true;
    } else if (arg == "--topology" && has_value) {
      a.topologies.push_back(argv[++i]);
    } else if (arg == "--ptc" && has_value) {
      a.ptc = argv[++i];
    } else if (arg == "--from" && has_value) {
      a.from = argv[++i];
    } else if (arg == "--to" && has_value) {
      a.to = argv[++i];
    } else if (arg == "--lost" && has_value) {
      a.lost.push_back(argv[++i]);
    } else if (arg == "--plane" && has_value) {
      a.plane = argv[++i];
    } else if (arg == "--set" && has_value) {
      a.sets.push_back(argv[++i]);
    } else {
      std::fprintf(arg == "--help" ? stdout : stderr,
                   "usage: reshard_scale_sim [--quick] [--topology FILE]... [--set KEY=VALUE]...\n"
                   "       reshard_scale_sim --ptc FILE --from FILE --to FILE [--lost HOST]...\n"
                   "                         --topology FILE [--plane "
                   "direct|host-staged|host-memory]\n"
                   "                         [--set KEY=VALUE]... [--json]\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  if (a.ptc.empty() != a.from.empty() || a.ptc.empty() != a.to.empty()) {
    std::fprintf(stderr, "--ptc, --from and --to go together\n");
    return 2;
  }
  return a.ptc.empty() ? Table(a) : One(a);
}

}  // namespace
}  // namespace reshard::bench

int main(int argc, char** argv) { return reshard::bench::Main(argc, argv); }
