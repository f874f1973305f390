// PgStore: the hosts aggregate (host_store.h): hosts, their leases, and which
// jobs and operations use them; deleted jobs, the lost hosts of jobs
// (job_lost_hosts, migrations/0002) and the generations agents free or drop.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/coordinator/store/pg_codec.h"
#include "services/coordinator/store/pg_heartbeat_statements.h"
#include "services/coordinator/store/pg_statements.h"
#include "services/coordinator/store/pg_store.h"
#include "services/coordinator/store/pg_store_internal.h"
#include "services/coordinator/store/store_checks.h"

namespace reshard::coordinator {
namespace {

using Ids = std::vector<std::string>;

Ids FirstColumn(const pqxx::result& r) {
  Ids ids;
  ids.reserve(r.size());
  for (const pqxx::row& row : r) ids.emplace_back(row[0].c_str());
  return ids;
}

absl::Status CheckHostIds(const Ids& host_ids) {
  for (const std::string& id : host_ids) {
    if (absl::Status s = pg::CheckText("host id", id); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> PgStore::RegisterHost(const v1::Host& host, int64_t now_unix_ms,
                                              int64_t lease_expires_unix_ms) {
  if (absl::Status s = CheckNewHost(host); !s.ok()) return s;
  // State, heartbeat and lease live in their own columns.
  v1::Host info = host;
  info.clear_state();
  info.clear_last_heartbeat_unix_ms();
  info.clear_lease_expires_unix_ms();
  info.clear_leaves_unix_ms();  // its own column: a notice outlives a registration before it
  const std::string info_bytes = info.SerializeAsString();
  return pg::TransactFor<int64_t>(*pool_, "RegisterHost", [&](pg::PgTx& tx) {
    const pqxx::result r = tx.Exec(pg::kUpsertHost, host.host_id(), host.address(),
                                   pg::Bytea(info_bytes), now_unix_ms, lease_expires_unix_ms);
    pg::WriteAudit(tx, "", "", host.host_id());
    return absl::StatusOr<int64_t>(r[0][0].as<int64_t>());
  });
}

absl::Status PgStore::Heartbeat(const std::string& host_id, int64_t epoch, int64_t now_unix_ms,
                                int64_t lease_expires_unix_ms) {
  return pool_->Transact("Heartbeat", [&](pg::PgTx& tx) -> absl::Status {
    if (!tx.Exec(pg::kHeartbeatHost, host_id, epoch, now_unix_ms, lease_expires_unix_ms).empty()) {
      return absl::OkStatus();
    }
    const pqxx::result r = tx.Exec(pg::kHostEpochState, host_id);
    return pg::HeartbeatRefusal(host_id, epoch, !r.empty(), r.empty() ? 0 : r[0][0].as<int64_t>());
  });
}

namespace {

// The hosts of a result of RESHARD_PG_HOST_COLUMNS rows.
absl::StatusOr<std::vector<v1::Host>> HostsOf(const pqxx::result& rows) {
  std::vector<v1::Host> hosts;
  hosts.reserve(rows.size());
  for (const pqxx::row& row : rows) {
    absl::StatusOr<v1::Host> host = pg::HostFromRow(row);
    if (!host.ok()) return host.status();
    hosts.push_back(*std::move(host));
  }
  return hosts;
}

}  // namespace

absl::StatusOr<std::vector<v1::Host>> PgStore::ListHosts() {
  using Hosts = std::vector<v1::Host>;
  return pg::TransactFor<Hosts>(*pool_, "ListHosts",
                                [&](pg::PgTx& tx) { return HostsOf(tx.Exec(pg::kListHosts)); });
}

absl::StatusOr<std::map<std::string, v1::HostState>> PgStore::HostStates() {
  using States = std::map<std::string, v1::HostState>;
  return pg::TransactFor<States>(*pool_, "HostStates", [&](pg::PgTx& tx) -> absl::StatusOr<States> {
    States states;
    for (const pqxx::row& row : tx.Exec(pg::kHostStates)) {
      states.emplace(row[0].c_str(), static_cast<v1::HostState>(row[1].as<int>()));
    }
    return states;
  });
}

absl::StatusOr<std::vector<v1::Host>> PgStore::GetHosts(const std::vector<std::string>& host_ids) {
  using Hosts = std::vector<v1::Host>;
  return pg::TransactFor<Hosts>(*pool_, "GetHosts", [&](pg::PgTx& tx) {
    return HostsOf(tx.Exec(pg::kGetHosts, pg::TextArray(host_ids)));
  });
}

absl::StatusOr<v1::Host> PgStore::GetHost(const std::string& host_id) {
  return pg::TransactFor<v1::Host>(
      *pool_, "GetHost", [&](pg::PgTx& tx) -> absl::StatusOr<v1::Host> {
        const pqxx::result r = tx.Exec(pg::kSelectHost, host_id);
        if (r.empty()) {
          return absl::NotFoundError(absl::StrCat("host \"", host_id, "\" not found"));
        }
        return pg::HostFromRow(r[0]);
      });
}

absl::Status PgStore::SetHostLeaves(const std::string& host_id, int64_t leaves_unix_ms) {
  return pool_->Transact("SetHostLeaves", [&](pg::PgTx& tx) -> absl::Status {
    if (tx.Exec(pg::kSetHostLeaves, host_id, leaves_unix_ms).empty()) {
      return absl::NotFoundError(absl::StrCat("host \"", host_id, "\" not found"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<Store::RegistrationsMark> PgStore::HostRegistrations() {
  return pg::TransactFor<RegistrationsMark>(
      *pool_, "HostRegistrations", [&](pg::PgTx& tx) -> absl::StatusOr<RegistrationsMark> {
        const pqxx::result r = tx.Exec(pg::kHostRegistrations);
        RegistrationsMark mark;
        mark.hosts = r[0][0].as<int64_t>();
        mark.epochs = r[0][1].as<int64_t>();
        return mark;
      });
}

absl::StatusOr<std::vector<std::string>> PgStore::ExpiredLeases(int64_t now_unix_ms) {
  return pg::TransactFor<Ids>(*pool_, "ExpiredLeases", [&](pg::PgTx& tx) {
    return absl::StatusOr<Ids>(FirstColumn(tx.Exec(pg::kExpiredLeases, now_unix_ms)));
  });
}

absl::StatusOr<std::vector<std::string>> PgStore::ExpireLeases(int64_t now_unix_ms) {
  return pg::TransactFor<Ids>(*pool_, "ExpireLeases", [&](pg::PgTx& tx) {
    Ids ids = FirstColumn(tx.Exec(pg::kExpireLeases, now_unix_ms));
    std::sort(ids.begin(), ids.end());
    return absl::StatusOr<Ids>(std::move(ids));
  });
}

absl::StatusOr<std::vector<std::string>> PgStore::OperationsOnHosts(const Ids& host_ids) {
  if (host_ids.empty()) return Ids();
  if (absl::Status s = CheckHostIds(host_ids); !s.ok()) return s;
  const std::string hosts = pg::TextArray(host_ids);
  return pg::TransactFor<Ids>(*pool_, "OperationsOnHosts", [&](pg::PgTx& tx) {
    return absl::StatusOr<Ids>(FirstColumn(tx.Exec(pg::kOperationsOnHosts, hosts)));
  });
}

absl::StatusOr<std::vector<std::string>> PgStore::JobsOnHosts(const Ids& host_ids) {
  if (host_ids.empty()) return Ids();
  if (absl::Status s = CheckHostIds(host_ids); !s.ok()) return s;
  const std::string hosts = pg::TextArray(host_ids);
  return pg::TransactFor<Ids>(*pool_, "JobsOnHosts", [&](pg::PgTx& tx) {
    return absl::StatusOr<Ids>(FirstColumn(tx.Exec(pg::kJobsOnHosts, hosts)));
  });
}

// ---- Liveness: deleted jobs and the lost hosts of jobs (job_lost_hosts) ------

absl::StatusOr<Ids> PgStore::DeletedJobs(const Ids& job_ids) {
  if (job_ids.empty()) return Ids();
  for (const std::string& id : job_ids) {
    if (absl::Status s = pg::CheckText("job id", id); !s.ok()) return s;
  }
  const std::string ids = pg::TextArray(job_ids);
  return pg::TransactFor<Ids>(*pool_, "DeletedJobs", [&](pg::PgTx& tx) {
    Ids deleted;
    for (const pqxx::row& row : tx.Exec(pg::kDeletedJobs, ids))
      deleted.emplace_back(row[0].c_str());
    return absl::StatusOr<Ids>(std::move(deleted));
  });
}

absl::StatusOr<std::vector<v1::GenerationRef>> PgStore::StaleGenerations(
    const std::vector<v1::GenerationRef>& held) {
  using Refs = std::vector<v1::GenerationRef>;
  if (held.empty()) return Refs();
  Ids jobs, generations;
  for (const v1::GenerationRef& g : held) {
    if (absl::Status s = pg::CheckText("job id", g.job_id()); !s.ok()) return s;
    jobs.push_back(g.job_id());
    generations.push_back(absl::StrCat(g.generation()));
  }
  const std::string job_array = pg::TextArray(jobs);
  const std::string generation_array = pg::TextArray(generations);
  return pg::TransactFor<Refs>(*pool_, "StaleGenerations", [&](pg::PgTx& tx) {
    return pg::GenerationRefsFromRows(tx.Exec(pg::kStaleGenerations, job_array, generation_array));
  });
}

absl::StatusOr<Ids> PgStore::JobsLostOnHost(const std::string& host_id) {
  if (absl::Status s = pg::CheckText("host id", host_id); !s.ok()) return s;
  return pg::TransactFor<Ids>(*pool_, "JobsLostOnHost", [&](pg::PgTx& tx) {
    Ids jobs;
    for (const pqxx::row& row : tx.Exec(pg::kJobsLostOnHost, host_id)) {
      jobs.emplace_back(row[0].c_str());
    }
    return absl::StatusOr<Ids>(std::move(jobs));
  });
}

absl::Status PgStore::RestoreLostHost(const std::string& job_id, const std::string& host_id) {
  return pool_->Transact("RestoreLostHost", [&](pg::PgTx& tx) -> absl::Status {
    if (tx.Exec(pg::kLockJob, job_id).empty()) return pg::JobNotFound(job_id);
    tx.Exec(pg::kClearJobLostHost, job_id, host_id);
    tx.Exec(pg::kSettleJobLiveness, job_id);
    return absl::OkStatus();
  });
}

absl::StatusOr<v1::JobState> PgStore::SettleJobLiveness(const std::string& job_id) {
  return pg::TransactFor<v1::JobState>(
      *pool_, "SettleJobLiveness", [&](pg::PgTx& tx) -> absl::StatusOr<v1::JobState> {
        const pqxx::result locked = tx.Exec(pg::kLockJob, job_id);
        if (locked.empty()) return pg::JobNotFound(job_id);
        const pqxx::result r = tx.Exec(pg::kSettleJobLiveness, job_id);
        const int state = r.empty() ? locked[0][1].as<int>() : r[0][0].as<int>();
        return static_cast<v1::JobState>(state);
      });
}

absl::StatusOr<std::vector<v1::GenerationRef>> PgStore::GenerationsToRelease(
    const std::string& host_id) {
  return pg::TransactFor<std::vector<v1::GenerationRef>>(
      *pool_, "GenerationsToRelease", [&](pg::PgTx& tx) {
        return pg::GenerationRefsFromRows(tx.Exec(pg::kGenerationsToRelease, host_id));
      });
}

absl::StatusOr<std::vector<v1::GenerationRef>> PgStore::GenerationsToDiscard(
    const std::string& host_id) {
  return pg::TransactFor<std::vector<v1::GenerationRef>>(
      *pool_, "GenerationsToDiscard", [&](pg::PgTx& tx) {
        return pg::GenerationRefsFromRows(tx.Exec(pg::kGenerationsToDiscard, host_id));
      });
}

}  // namespace reshard::coordinator
