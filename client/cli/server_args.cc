// Parsing of reshardctl's server command lines (server_commands.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/cli/advise_command.h"
#include "client/cli/args.h"
#include "client/cli/server_commands.h"
#include "planner/layout.h"

namespace reshard::cli {
namespace {

const char kGlobalHelp[] =
    "\n"
    "global flags (before or after the command):\n"
    "  --coordinator HOST:PORT   the coordinator (default $RESHARD_COORDINATOR, else "
    "127.0.0.1:7070)\n"
    "  --output table|json       json: the reply as proto JSON (original field names)\n"
    "  --timeout DURATION        deadline of each call, retries included (default 30s)\n"
    "  --tls-ca FILE             CA of the coordinator's certificate ($RESHARD_TLS_CA)\n"
    "  --tls-cert FILE           client certificate for mutual TLS ($RESHARD_TLS_CERT)\n"
    "  --tls-key FILE            its key ($RESHARD_TLS_KEY)\n"
    "  --token-file FILE         bearer token ($RESHARD_TOKEN_FILE; or $RESHARD_TOKEN)\n"
    "  --insecure                plaintext, for a coordinator run --insecure ($RESHARD_INSECURE)\n"
    "\n"
    "exit status: 0 ok, 1 error, 2 usage, 3 operation ABORTED/FAILED, 4 NOT_FOUND,\n"
    "5 conflict (FAILED_PRECONDITION, ALREADY_EXISTS, ABORTED), 6 coordinator unreachable.\n";

const char kWaitHelp[] =
    "  --no-wait                 print the operation's id and return once it is created\n"
    "  --wait-timeout DURATION   stop waiting after this long (exit 6; the operation goes on)\n"
    "  --expected-generation N   refuse (exit 5) unless the job is at generation N\n"
    "                            (default: the generation it is at now)\n"
    "  --idempotency-key KEY     a retried command with the same key returns the first\n"
    "                            one's operation instead of starting another\n"
    "Waits for the operation with a progress bar on stderr (plain lines when stderr is\n"
    "not a terminal) and prints the final operation; exit 3 when it ends ABORTED or FAILED.\n";

const char kStopFreeHelp[] =
    "  --stop-free               two-phase: planned now, the job trains on in its old\n"
    "                            layout until the new workers call mark-prepared and the\n"
    "                            old ones cut over at a step (a checkpoint naming the\n"
    "                            operation); only that cut-over pauses the job. Waiting\n"
    "                            follows the operation to its commit; the table shows its\n"
    "                            prepare and pause seconds (docs/coordinator.md)\n";

const char kDeadlineHelp[] =
    "  --deadline WHEN           the operation must end by WHEN: a duration from now\n"
    "                            (90s, 10m) or an RFC 3339 time. The coordinator predicts\n"
    "                            it first and refuses at once (exit 5), naming the\n"
    "                            prediction and an alternative, when it would end later\n"
    "  --abort-past-deadline     abort it cleanly if it still runs at WHEN (default: it\n"
    "                            goes on; ops show gives its ETA) (docs/scheduler.md)\n";

struct CommandSpec {
  const char* name;
  std::vector<std::string> args;  // positional argument names
  std::vector<std::string> flags;
  std::vector<std::string> bool_flags;
  std::vector<std::string> required;  // flags that must be given
  std::string usage;
};

std::vector<std::string> Joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<CommandSpec>& Specs() {
  static const auto* specs = new std::vector<CommandSpec>{
      {"jobs list",
       {},
       {"tenant", "state"},
       {},
       {},
       "usage: reshardctl jobs list [--tenant T] [--state ACTIVE|RECONFIGURING|DEGRADED|FAILED]\n"
       "\nLists jobs (every page).\n"},
      {"jobs show",
       {"JOB"},
       {},
       {"ptc"},
       {},
       "usage: reshardctl jobs show JOB [--ptc]\n"
       "\nShows a job: state, generation, layout, placement, lost hosts.\n"
       "  --ptc   include the tensor collection (with --output json)\n"},
      {"jobs register",
       {},
       {"spec", "idempotency-key"},
       {},
       {"spec"},
       "usage: reshardctl jobs register --spec JOB.json [--idempotency-key KEY]\n"
       "\nRegisters a job (a reshard.v1.JobSpec in JSON) and prints it.\n"},
      {"jobs delete",
       {"JOB"},
       {"idempotency-key"},
       {},
       {},
       "usage: reshardctl jobs delete JOB\n\nDeletes a job.\n"},
      {"jobs policy",
       {"JOB"},
       {"policy"},
       {"clear"},
       {},
       "usage: reshardctl jobs policy JOB --policy POLICY.json | --clear\n"
       "\nSets the job's elastic policy (a reshard.v1.ElasticPolicy in JSON: heal, grow,\n"
       "minDevices, maxDevices, spareHosts, growAt, acceptDegraded, allowed) or clears\n"
       "it. The coordinator then heals the job after a host loss and grows it onto\n"
       "free spares by itself; jobs show gives the policy's status, audit its actions\n"
       "(docs/scheduler.md, \"Elastic policies\"). Prints the job.\n"},
      {"jobs worker-token",
       {"JOB"},
       {},
       {},
       {},
       "usage: reshardctl jobs worker-token JOB\n"
       "\nPrints the job's worker token (admin, or a scheduler of the job's tenant). Hand\n"
       "it to the job's training workers (RESHARD_WORKER_TOKEN, Worker(worker_token=...)):\n"
       "their agent serves them only with it. Every call is audited.\n"},
      {"resize",
       {"JOB"},
       Joined({"to", "expected-generation", "idempotency-key", "wait-timeout", "deadline"},
              AdviseValueFlags()),
       Joined({"no-wait", "choose", "stop-free", "abort-past-deadline"}, AdviseBoolFlags()),
       {},
       absl::StrCat("usage: reshardctl resize JOB --to LAYOUT.json [--stop-free] [--no-wait]\n"
                    "       reshardctl resize JOB --choose --gpus N [advise flags] [--no-wait]\n"
                    "\nMoves a job to a new layout: a reshard.v1.Layout in JSON (a missing\n"
                    "config keeps the current one), or with --choose the one the coordinator's\n"
                    "advisor finds best for --horizon (see reshardctl advise --help).\n\n",
                    kStopFreeHelp, kDeadlineHelp, kWaitHelp)},
      {"advise",
       {"JOB"},
       AdviseValueFlags(),
       Joined({"json"}, AdviseBoolFlags()),
       {"gpus"},
       absl::StrCat("usage: reshardctl advise JOB --gpus N [--hosts H1,H2] [--horizon 1h]\n"
                    "         [model and device flags] [--output json]\n"
                    "\nAsks the coordinator which layouts suit JOB on N devices: the Pareto set\n"
                    "of predicted step time and memory per device, each with the cost of the\n"
                    "move from the current layout; * marks the best for the horizon.\n",
                    AdviseFlagsHelp())},
      {"migrate",
       {"JOB"},
       {"to", "expected-generation", "idempotency-key", "wait-timeout", "deadline"},
       {"no-wait", "stop-free", "abort-past-deadline"},
       {"to"},
       absl::StrCat("usage: reshardctl migrate JOB --to LAYOUT.json [--stop-free] [--no-wait]\n"
                    "\nMoves a job's ranks to other devices, same config (the layout file's\n"
                    "placement is used; its world size must match).\n\n",
                    kStopFreeHelp, kDeadlineHelp, kWaitHelp)},
      {"recover",
       {"JOB"},
       Joined({"lost", "to", "expected-generation", "idempotency-key", "wait-timeout", "deadline"},
              AdviseValueFlags()),
       Joined({"no-wait", "choose", "accept-degraded", "abort-past-deadline"}, AdviseBoolFlags()),
       {"lost"},
       absl::StrCat(
           "usage: reshardctl recover JOB --lost HOSTS [--to LAYOUT.json] [--accept-degraded]\n"
           "         [--no-wait]\n"
           "       reshardctl recover JOB --lost HOSTS --choose --gpus N [advise flags]\n"
           "\nRebuilds a job's state from the survivors after hosts or ranks were lost.\n"
           "  --lost LIST    comma-separated hosts or old ranks (rank:N is always a rank)\n"
           "  --to FILE      the new layout; default: the coordinator keeps the current\n"
           "                 config and shrinks data parallelism to the surviving devices.\n"
           "                 A crashed rank restarts in place when the layout keeps its\n"
           "                 device on a live host (--to with the current layout)\n"
           "  --choose       the coordinator's advisor picks the layout on the surviving\n"
           "                 hosts instead (see reshardctl advise --help)\n"
           "  --accept-degraded\n"
           "                 recover even when the new layout gives up the job's HSDP\n"
           "                 replicas or its surviving the loss of any one host (refused\n"
           "                 otherwise, naming what is lost and a layout that keeps it)\n",
           kDeadlineHelp, kWaitHelp)},
      {"preview",
       {"JOB"},
       {"to", "lost"},
       {},
       {"to"},
       "usage: reshardctl preview JOB --to LAYOUT.json [--lost LIST]\n"
       "\nPlans the move to LAYOUT.json against the current generation and shows\n"
       "its traffic and the coordinator's predicted seconds (critical host and\n"
       "link, the plan's own bound, each host's phases); nothing is stored or\n"
       "moved.\n"},
      {"hosts list",
       {},
       {},
       {},
       {},
       "usage: reshardctl hosts list\n\nLists hosts and their agents' lease.\n"},
      {"hosts notice",
       {"HOST"},
       {"leaves", "spare", "idempotency-key"},
       {"withdraw"},
       {},
       "usage: reshardctl hosts notice HOST --leaves WHEN [--spare H1,H2]\n"
       "       reshardctl hosts notice HOST --withdraw\n"
       "\nSays that HOST goes away at WHEN (a preemption, a spot reclaim, a drain; admin\n"
       "only, audited): the coordinator moves every job on it off before then, onto a\n"
       "spare or onto the job's other hosts, or says at once why it cannot and what\n"
       "the job keeps when HOST goes. Prints one line per job (docs/scheduler.md).\n"
       "Until then HOST is no spare and no resize or migration places ranks on it.\n"
       "  --leaves WHEN   a duration from now (90s, 10m) or an RFC 3339 time\n"
       "  --spare LIST    hosts that may take HOST's place, in order, one per job\n"
       "  --withdraw      withdraws HOST's notice (moves already started go on)\n"},
      {"ops show", {"OP"}, {}, {}, {}, "usage: reshardctl ops show OP\n\nShows an operation.\n"},
      {"ops watch",
       {"OP"},
       {"wait-timeout"},
       {},
       {},
       "usage: reshardctl ops watch OP [--wait-timeout DURATION]\n"
       "\nFollows an operation until it is final, with progress on stderr; prints the\n"
       "final operation. Exit 0 COMMITTED, 3 ABORTED or FAILED.\n"},
      {"auth create",
       {},
       {"name", "role", "tenants", "ttl"},
       {},
       {"name", "role"},
       "usage: reshardctl auth create --name NAME --role admin|scheduler|viewer\n"
       "         [--tenants T1,T2] [--ttl DURATION]\n"
       "\nCreates a bearer token (admin only) and prints it once: the coordinator keeps\n"
       "only its hash. A scheduler or viewer token needs --tenants. --ttl: its\n"
       "lifetime (default 30 days, at most 366).\n"},
      {"auth revoke",
       {"TOKEN_ID"},
       {},
       {},
       {},
       "usage: reshardctl auth revoke TOKEN_ID\n\nRevokes a token at once (admin only).\n"},
      {"auth list",
       {},
       {},
       {},
       {},
       "usage: reshardctl auth list\n\nLists tokens: id, name, role, tenants, expiry (never "
       "secrets).\n"},
      {"audit",
       {},
       {"job", "tenant", "since", "limit"},
       {"json"},
       {},
       "usage: reshardctl audit [--job JOB] [--tenant TENANT] [--since WHEN] [--limit N]\n"
       "         [--json]\n"
       "\nLists the audit trail, newest first: every mutating call with who made it, its\n"
       "tenant, method, job and result, refusals included (an admin sees every tenant; a\n"
       "scheduler or viewer its own).\n"
       "  --since WHEN   a duration back from now (1h, 30m) or an RFC 3339 time\n"
       "  --limit N      at most N entries (default 100)\n"
       "  --json         the same as --output json\n"},
      {"ops mark-prepared",
       {"OP"},
       {},
       {},
       {},
       "usage: reshardctl ops mark-prepared OP\n"
       "\nSays that a stop-free operation's new workers are warm (scheduler of the job's\n"
       "tenant; audited): its job's old workers may now cut over at a step boundary.\n"
       "The operation must be stop-free and PLANNED (else exit 5); a repeat keeps the\n"
       "first time. Prints the operation.\n"},
      {"ops cancel",
       {"OP"},
       {"idempotency-key"},
       {},
       {},
       "usage: reshardctl ops cancel OP\n\nAborts a running operation.\n"},
  };
  return *specs;
}

const std::vector<std::string> kGroups = {"jobs", "hosts", "ops", "auth"};

const CommandSpec* FindSpec(const std::string& name) {
  for (const CommandSpec& s : Specs()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::vector<std::string> Subcommands(const std::string& group) {
  std::vector<std::string> out;
  for (const CommandSpec& s : Specs()) {
    const std::string name = s.name;
    if (name.rfind(group + " ", 0) == 0) out.push_back(name.substr(group.size() + 1));
  }
  return out;
}

}  // namespace

bool IsServerCommand(const std::string& name) {
  return FindSpec(name) != nullptr ||
         std::find(kGroups.begin(), kGroups.end(), name) != kGroups.end();
}

std::string ServerUsage(const std::string& command) {
  if (const CommandSpec* s = FindSpec(command)) return absl::StrCat(s->usage, kGlobalHelp);
  std::string out = absl::StrCat("usage: reshardctl ", command, " SUBCOMMAND\n\nsubcommands:\n");
  for (const std::string& sub : Subcommands(command)) {
    const std::string& usage = FindSpec(absl::StrCat(command, " ", sub))->usage;
    absl::StrAppend(&out, "  ", absl::StripPrefix(usage.substr(0, usage.find('\n')), "usage: "),
                    "\n");
  }
  return absl::StrCat(out, kGlobalHelp);
}

absl::StatusOr<absl::Duration> ParseTimeout(const std::string& text) {
  absl::Duration d;
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds) && std::isfinite(seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a duration (e.g. 30s, 2m, 500ms)"));
  }
  if (d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\": must be positive"));
  }
  return d;
}

namespace {

// A time as a flag gives it: an RFC 3339 time, or a duration back from
// `now_unix_ms` (`ahead` false) or ahead of it; unix milliseconds.
absl::StatusOr<int64_t> ParseTimeFlag(const std::string& flag, const std::string& text,
                                      int64_t now_unix_ms, bool ahead) {
  absl::Time t;
  std::string error;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &error)) return absl::ToUnixMillis(t);
  absl::StatusOr<absl::Duration> d = ParseTimeout(text);
  if (!d.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " \"", text, "\": expected a duration ",
                     ahead ? "from now (90s, 10m)" : "back from now (1h, 30m)",
                     " or an RFC 3339 time (2026-01-02T15:04:05Z)"));
  }
  const int64_t ms = absl::ToInt64Milliseconds(*d);
  return ahead ? now_unix_ms + ms : std::max<int64_t>(0, now_unix_ms - ms);
}

}  // namespace

absl::StatusOr<int64_t> ParseWhen(const std::string& flag, const std::string& text,
                                  int64_t now_unix_ms) {
  return ParseTimeFlag(flag, text, now_unix_ms, /*ahead=*/true);
}

absl::StatusOr<int64_t> ParseSince(const std::string& text, int64_t now_unix_ms) {
  return ParseTimeFlag("since", text, now_unix_ms, /*ahead=*/false);
}

namespace {

// For a group ("jobs", "ops", ...), the first argument that is not a flag
// names the subcommand: taken out of `rest` into inv->command. A group
// with --help and no subcommand sets inv->help.
absl::Status TakeSubcommand(std::vector<std::string>* rest_args, ServerInvocation* inv) {
  std::vector<std::string>& rest = *rest_args;
  const std::string command = inv->command;
  if (std::find(kGroups.begin(), kGroups.end(), command) != kGroups.end()) {
    // The first argument that is not a flag names the subcommand.
    auto it = std::find_if(rest.begin(), rest.end(),
                           [](const std::string& a) { return a.empty() || a[0] != '-'; });
    if (it == rest.end()) {
      if (std::find(rest.begin(), rest.end(), "--help") != rest.end() ||
          std::find(rest.begin(), rest.end(), "-h") != rest.end()) {
        inv->help = true;
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrCat("missing subcommand of \"", command,
                                                     "\": one of ",
                                                     absl::StrJoin(Subcommands(command), ", ")));
    }
    inv->command = absl::StrCat(command, " ", *it);
    if (FindSpec(inv->command) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown subcommand \"", *it, "\" of \"",
                                                     command, "\": expected one of ",
                                                     absl::StrJoin(Subcommands(command), ", ")));
    }
    rest.erase(it);
  }
  return absl::OkStatus();
}

// The command's positional arguments: as many as it takes, none empty.
absl::Status TakePositional(const CommandSpec& spec, const ParsedArgs& parsed,
                            ServerInvocation* inv) {
  if (parsed.positional.size() < spec.args.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing ", spec.args[parsed.positional.size()]));
  }
  if (parsed.positional.size() > spec.args.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", parsed.positional[spec.args.size()], "\""));
  }
  for (size_t i = 0; i < spec.args.size(); ++i) {
    if (parsed.positional[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(spec.args[i], " is empty"));
    }
  }
  inv->positional = parsed.positional;
  return absl::OkStatus();
}

// The global options (flags over environment over defaults) into
// inv->global, the command's own flags into inv->flags.
absl::Status TakeFlags(const ParsedArgs& parsed, const std::string& coordinator_env,
                       const GetEnv& getenv, ServerInvocation* inv) {
  inv->global.coordinator = coordinator_env.empty() ? kDefaultCoordinator : coordinator_env;
  auto env = [&](const char* name) -> std::string {
    const char* v = getenv ? getenv(name) : nullptr;
    return v == nullptr ? "" : v;
  };
  inv->global.tls.ca = env("RESHARD_TLS_CA");
  inv->global.tls.cert = env("RESHARD_TLS_CERT");
  inv->global.tls.key = env("RESHARD_TLS_KEY");
  if (const std::string insecure = env("RESHARD_INSECURE"); !insecure.empty()) {
    if (!ParseBool(insecure, &inv->global.tls.insecure).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("RESHARD_INSECURE \"", insecure, "\": expected true or false"));
    }
  }
  std::string token_file = env("RESHARD_TOKEN_FILE");
  inv->global.token = env("RESHARD_TOKEN");
  for (const auto& [name, value] : parsed.values) {
    if (name == "coordinator") {
      if (value.empty()) return absl::InvalidArgumentError("--coordinator is empty");
      inv->global.coordinator = value;
    } else if (name == "output") {
      if (value == "table") {
        inv->global.output = GlobalOptions::Output::kTable;
      } else if (value == "json") {
        inv->global.output = GlobalOptions::Output::kJson;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--output \"", value, "\": expected table or json"));
      }
    } else if (name == "json") {
      inv->global.output = GlobalOptions::Output::kJson;
    } else if (name == "insecure") {
      inv->global.tls.insecure = true;
    } else if (name == "tls-ca") {
      inv->global.tls.ca = value;
    } else if (name == "tls-cert") {
      inv->global.tls.cert = value;
    } else if (name == "tls-key") {
      inv->global.tls.key = value;
    } else if (name == "token-file") {
      token_file = value;
    } else if (name == "timeout") {
      absl::StatusOr<absl::Duration> d = ParseTimeout(value);
      if (!d.ok())
        return absl::InvalidArgumentError(absl::StrCat("--timeout ", d.status().message()));
      inv->global.timeout = *d;
    } else {
      inv->flags[name] = value;
    }
  }
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    std::string token;
    if (!in.good() || !std::getline(in, token)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file \"", token_file, "\": cannot read a token from it"));
    }
    inv->global.token = std::string(absl::StripAsciiWhitespace(token));
  }
  return absl::OkStatus();
}

// What each command requires of its flags, and the flags' values that are
// checked before any call (so that a typo fails before the coordinator is
// asked anything).
absl::Status CheckCommandFlags(const CommandSpec& spec, const ServerInvocation& inv) {
  for (const std::string& r : spec.required) {
    if (!inv.flags.contains(r) || inv.flags.at(r).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("missing --", r));
    }
  }
  if (inv.command == "resize" || inv.command == "recover") {
    const bool choose = inv.flags.contains("choose");
    if (inv.command == "resize" && choose == inv.flags.contains("to")) {
      return absl::InvalidArgumentError("resize: give either --to LAYOUT.json or --choose");
    }
    if (choose && inv.flags.contains("to")) {
      return absl::InvalidArgumentError("recover: give either --to LAYOUT.json or --choose");
    }
    if (choose && !inv.flags.contains("gpus")) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing --gpus (", inv.command, " --choose)"));
    }
    for (const std::vector<std::string>* names : {&AdviseValueFlags(), &AdviseBoolFlags()}) {
      for (const std::string& name : *names) {
        if (!choose && inv.flags.contains(name)) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, ": only with --choose"));
        }
      }
    }
  }
  if (inv.command == "hosts notice") {
    const bool withdraw = inv.flags.contains("withdraw");
    if (withdraw && (inv.flags.contains("leaves") || inv.flags.contains("spare"))) {
      return absl::InvalidArgumentError("hosts notice: --withdraw takes no --leaves or --spare");
    }
    if (!withdraw && (!inv.flags.contains("leaves") || inv.flags.at("leaves").empty())) {
      return absl::InvalidArgumentError("hosts notice: give --leaves WHEN, or --withdraw");
    }
  }
  if (inv.command == "advise" || inv.flags.contains("choose")) {
    absl::StatusOr<v1::AdviseRequest> advise = AdviseRequestFromFlags(inv.flags, "");
    if (!advise.ok()) return advise.status();
  }
  for (const char* flag : {"deadline", "leaves"}) {
    if (auto it = inv.flags.find(flag); it != inv.flags.end()) {
      if (absl::StatusOr<int64_t> when = ParseWhen(flag, it->second, 0); !when.ok()) {
        return when.status();
      }
    }
  }
  if (inv.flags.contains("abort-past-deadline") && !inv.flags.contains("deadline")) {
    return absl::InvalidArgumentError("--abort-past-deadline needs --deadline");
  }
  if (auto it = inv.flags.find("wait-timeout"); it != inv.flags.end()) {
    absl::StatusOr<absl::Duration> d = ParseTimeout(it->second);
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--wait-timeout ", d.status().message()));
    }
  }
  if (auto it = inv.flags.find("expected-generation"); it != inv.flags.end()) {
    int64_t g = 0;
    if (!absl::SimpleAtoi(it->second, &g) || g <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--expected-generation \"", it->second, "\": expected a positive integer"));
    }
  }
  if (auto it = inv.flags.find("state"); it != inv.flags.end()) {
    v1::JobState state;
    if (!v1::JobState_Parse(absl::StrCat("JOB_STATE_", it->second), &state) &&
        !v1::JobState_Parse(it->second, &state)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--state \"", it->second, "\": expected ACTIVE, RECONFIGURING, DEGRADED or FAILED"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ServerInvocation> ParseServerArgs(const std::string& command,
                                                 const std::vector<std::string>& args,
                                                 const std::string& coordinator_env,
                                                 const GetEnv& getenv) {
  ServerInvocation inv;
  std::vector<std::string> rest = args;
  inv.command = command;
  if (absl::Status s = TakeSubcommand(&rest, &inv); !s.ok()) return s;
  if (inv.help) return inv;
  const CommandSpec* spec = FindSpec(inv.command);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown command \"", command, "\""));
  }
  std::vector<std::string> value_flags = spec->flags;
  for (const char* g :
       {"coordinator", "output", "timeout", "tls-ca", "tls-cert", "tls-key", "token-file"}) {
    value_flags.push_back(g);
  }
  std::vector<std::string> bool_flags = spec->bool_flags;
  bool_flags.push_back("insecure");
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(rest, value_flags, bool_flags);
  if (!parsed.ok()) return parsed.status();
  inv.help = parsed->help;
  if (inv.help) return inv;
  if (absl::Status s = TakePositional(*spec, *parsed, &inv); !s.ok()) return s;
  if (absl::Status s = TakeFlags(*parsed, coordinator_env, getenv, &inv); !s.ok()) return s;
  if (absl::Status s = CheckCommandFlags(*spec, inv); !s.ok()) return s;
  return inv;
}

}  // namespace reshard::cli
