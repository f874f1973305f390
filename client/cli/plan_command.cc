#include "client/cli/plan_command.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cli/args.h"
#include "client/cli/json_file.h"
#include "client/cli/lost_set.h"
#include "client/cli/plan_summary.h"
#include "common/rpc/status.h"
#include "google/protobuf/util/json_util.h"
#include "planner/planner.h"
#include "planner/validate.h"
#include "reshard/v1/plan.pb.h"
#include "reshard/v1/ptc.pb.h"

namespace reshard::cli {

const char kPlanUsage[] =
    "usage: reshardctl plan --spec JOB.json --to TARGET.json [--lost LIST]\n"
    "                       [--format summary|json]\n"
    "\n"
    "Plans moving a job's state from its current layout to a new one, offline.\n"
    "\n"
    "  --spec JOB.json     the job: a reshard.v1.JobSpec (PTC + current layout)\n"
    "                      in the protobuf JSON mapping\n"
    "  --to TARGET.json    the new layout: a reshard.v1.Layout in JSON\n"
    "  --lost LIST         comma-separated hosts or old ranks whose state is gone:\n"
    "                      a host name of the job's placement is a host, an\n"
    "                      integer is a rank, rank:N is always a rank\n"
    "  --format FORMAT     summary (default): a readable table of traffic;\n"
    "                      json: the reshard.v1.TransferPlan\n"
    "  --output FORMAT     table (= summary) or json, as for every command\n"
    "  -h, --help          this text\n"
    "\n"
    "Exit status: 0 planned, 1 error (bad file or spec, lost data), 2 usage error.\n"
    "\n"
    "example:\n"
    "  reshardctl plan --spec examples/gpt3-xl/job.json \\\n"
    "      --to examples/gpt3-xl/after-lost-node-3.json --lost node-3\n";

namespace {

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

absl::StatusOr<PlanOptions> ParsePlanArgs(const std::vector<std::string>& args) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(args, {"spec", "to", "lost", "format", "output"});
  if (!parsed.ok()) return parsed.status();
  PlanOptions options;
  options.help = parsed->help;
  if (options.help) return options;
  if (!parsed->positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", parsed->positional.front(), "\""));
  }
  auto take = [&](const std::string& name, std::string* out) {
    auto it = parsed->values.find(name);
    if (it == parsed->values.end()) return false;
    *out = it->second;
    return true;
  };
  if (!take("spec", &options.spec_path) || options.spec_path.empty()) {
    return absl::InvalidArgumentError("missing --spec JOB.json");
  }
  if (!take("to", &options.target_path) || options.target_path.empty()) {
    return absl::InvalidArgumentError("missing --to TARGET.json");
  }
  take("lost", &options.lost);
  std::string format = "summary";
  take("format", &format);
  // --output, as every other command has it: json, or table (= summary).
  if (std::string output; take("output", &output)) {
    if (parsed->values.contains("format")) {
      return absl::InvalidArgumentError("give --format or --output, not both");
    }
    format = output == "table" ? "summary" : output;
  }
  if (format == "summary") {
    options.format = PlanOptions::Format::kSummary;
  } else if (format == "json") {
    options.format = PlanOptions::Format::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--format \"", format, "\": expected summary or json"));
  }
  return options;
}

absl::Status RunPlan(const PlanOptions& options, std::ostream& out) {
  v1::JobSpec spec;
  if (absl::Status s = ReadJsonMessage(options.spec_path, "--spec", &spec); !s.ok()) return s;
  if (absl::Status s = planner::ValidateJobSpec(spec); !s.ok()) {
    return rpc::WithContext(s, absl::StrCat("--spec \"", options.spec_path, "\""));
  }
  v1::Layout target;
  if (absl::Status s = ReadJsonMessage(options.target_path, "--to", &target); !s.ok()) return s;
  absl::StatusOr<planner::LostSet> lost = ParseLostSet(options.lost, spec.layout());
  if (!lost.ok()) return lost.status();

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(spec.ptc(), spec.layout(), target, *lost);
  const double plan_ms = MillisSince(start);
  if (!plan.ok()) {
    return rpc::WithContext(plan.status(), absl::StrCat("planning \"", options.spec_path,
                                                        "\" -> \"", options.target_path, "\""));
  }
  const auto proto_start = std::chrono::steady_clock::now();
  const v1::TransferPlan proto = planner::ToProto(*plan, spec.layout(), target);
  const double to_proto_ms = MillisSince(proto_start);

  if (options.format == PlanOptions::Format::kJson) {
    google::protobuf::util::JsonPrintOptions print;
    print.add_whitespace = true;
    print.preserve_proto_field_names = true;
    std::string json;
    // The whole plan: every replica's steps written out (a plan whose
    // replicas plan alone repeats replica 0's; docs/partitioning.md).
    const auto printed =
        google::protobuf::util::MessageToJsonString(planner::ExpandReplicas(proto), &json, print);
    if (!printed.ok()) {
      return absl::InternalError(
          absl::StrCat("printing the plan as JSON: ", std::string(printed.message())));
    }
    out << json;
    if (json.empty() || json.back() != '\n') out << '\n';
  } else {
    SummaryContext context;
    context.job_name = spec.name();
    context.spec_path = options.spec_path;
    context.target_path = options.target_path;
    context.num_layers = spec.ptc().num_layers();
    context.lost_hosts = lost->hosts;
    context.plan_ms = plan_ms;
    context.to_proto_ms = to_proto_ms;
    out << FormatPlanSummary(context, proto);
  }
  out.flush();
  if (!out) return absl::UnavailableError("writing the plan to standard output failed");
  return absl::OkStatus();
}

void PrintError(const absl::Status& status, std::ostream& err) {
  err << absl::StatusCodeToString(status.code()) << ": " << status.message() << "\n";
}

int PlanMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<PlanOptions> options = ParsePlanArgs(args);
  if (!options.ok()) {
    PrintError(rpc::WithContext(options.status(), "reshardctl plan"), err);
    err << "run \"reshardctl plan --help\" for usage\n";
    return 2;
  }
  if (options->help) {
    out << kPlanUsage;
    return 0;
  }
  if (absl::Status s = RunPlan(*options, out); !s.ok()) {
    PrintError(s, err);
    return 1;
  }
  return 0;
}

}  // namespace reshard::cli
