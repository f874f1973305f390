#include "tests/coordinator/harness/test_postgres.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <pqxx/pqxx>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/coordinator/harness/child_process.h"

namespace reshard::coordinator::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kSuperuser[] = "reshard";
constexpr int kStartAttempts = 5;
constexpr std::chrono::seconds kReadyTimeout{30};

// Where data directories go: $RESHARD_TEST_PG_DIR; else /dev/shm when it
// has room (tmpfs makes CREATE DATABASE ~5x faster); else $TMPDIR or /tmp.
std::string TempRoot() {
  if (const char* d = std::getenv("RESHARD_TEST_PG_DIR"); d != nullptr && *d != '\0') return d;
  constexpr uint64_t kMinFree = uint64_t{1} << 30;
  struct statvfs vfs {};
  if (access("/dev/shm", W_OK | X_OK) == 0 && statvfs("/dev/shm", &vfs) == 0 &&
      static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >= kMinFree) {
    return "/dev/shm";
  }
  const char* t = std::getenv("TMPDIR");
  return (t != nullptr && *t != '\0') ? t : "/tmp";
}

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

absl::StatusOr<std::string> FindBinDir(const std::string& configured) {
  std::vector<std::string> candidates;
  if (!configured.empty()) candidates.push_back(configured);
  if (const char* env = std::getenv("RESHARD_PG_BINDIR"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  }
  if (FILE* p = popen("pg_config --bindir 2>/dev/null", "r"); p != nullptr) {
    char buf[512] = {0};
    if (fgets(buf, sizeof(buf), p) != nullptr) {
      candidates.emplace_back(absl::StripTrailingAsciiWhitespace(buf));
    }
    pclose(p);
  }
  std::error_code ec;
  std::vector<std::string> versions;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    versions.push_back((entry.path() / "bin").string());
  }
  std::sort(versions.rbegin(), versions.rend());
  candidates.insert(candidates.end(), versions.begin(), versions.end());
  for (const std::string& dir : candidates) {
    if (IsExecutable(dir + "/initdb") && IsExecutable(dir + "/postgres")) return dir;
  }
  return absl::NotFoundError(
      "no PostgreSQL server binaries (initdb, postgres) found: set RESHARD_PG_BINDIR or install "
      "postgresql (Debian: /usr/lib/postgresql/15/bin)");
}

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return absl::InternalError("could not bind a loopback port");
  return ntohs(addr.sin_port);
}

// Letters, digits and '_' only, lowercase, at most 40 characters.
std::string DatabaseNamePart(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (out.size() == 40) break;
    out.push_back(std::isalnum(static_cast<unsigned char>(c))
                      ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
                      : '_');
  }
  return out.empty() ? "db" : out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TestPostgres>> TestPostgres::Start(Options options) {
  std::unique_ptr<TestPostgres> pg(new TestPostgres(std::move(options)));
  if (absl::Status s = pg->Init(); !s.ok()) return s;
  return pg;
}

TestPostgres::~TestPostgres() {
  (void)Kill();
  if (!dir_.empty()) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string TestPostgres::DsnFor(absl::string_view database) const {
  return absl::StrCat("host=127.0.0.1 port=", port_, " user=", kSuperuser, " dbname=", database,
                      " connect_timeout=10");
}

absl::Status TestPostgres::Init() {
  absl::StatusOr<std::string> bin = FindBinDir(options_.bin_dir);
  if (!bin.ok()) return bin.status();
  bin_dir_ = *bin;

  if (geteuid() == 0) {
    const passwd* pw = getpwnam("postgres");
    if (pw == nullptr) {
      return absl::FailedPreconditionError(
          "running as root, but there is no `postgres` user to run the server as");
    }
    as_postgres_user_ = true;
    uid_ = pw->pw_uid;
    gid_ = pw->pw_gid;
  }

  std::string pattern = TempRoot() + "/reshard-pg-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, " failed"));
  }
  dir_ = pattern;
  data_dir_ = dir_ + "/data";
  if (as_postgres_user_ && chown(dir_.c_str(), uid_, gid_) != 0) {
    return absl::InternalError(absl::StrCat("chown ", dir_, " to postgres failed"));
  }

  ChildOptions child;
  child.cwd = dir_;
  child.log_path = dir_ + "/initdb.log";
  child.switch_user = as_postgres_user_;
  child.uid = uid_;
  child.gid = gid_;
  const auto initdb = [&](const std::string& target) {
    ChildOptions c = child;
    c.argv = {bin_dir_ + "/initdb", "-D", target, "-U",         kSuperuser,         "--auth=trust",
              "--no-sync",          "-E", "UTF8", "--locale=C", "--no-instructions"};
    return RunChild(c);
  };

  if (!options_.reuse_initdb) {
    if (absl::Status s = initdb(data_dir_); !s.ok()) return s;
  } else {
    // A data directory initialised once per machine, user and binaries;
    // built aside and renamed into place, so concurrent tests never see a
    // half-built one.
    struct stat st {};
    stat((bin_dir_ + "/initdb").c_str(), &st);
    const std::string cache =
        absl::StrCat(TempRoot(), "/reshard-pg-initdb-", geteuid(), "-",
                     std::hash<std::string>()(absl::StrCat(bin_dir_, ":", st.st_mtime)));
    if (access((cache + "/PG_VERSION").c_str(), R_OK) != 0) {
      const std::string building = absl::StrCat(cache, ".building.", getpid());
      if (absl::Status s = initdb(building); !s.ok()) return s;
      if (rename(building.c_str(), cache.c_str()) != 0) {
        std::error_code ec;
        fs::remove_all(building, ec);  // another process got there first
      }
    }
    ChildOptions copy = child;
    copy.argv = {"/bin/cp", "-a", cache, data_dir_};
    if (absl::Status s = RunChild(copy); !s.ok()) return s;
  }

  absl::Status started;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    absl::StatusOr<int> port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    port_ = *port;
    started = StartServer();
    // Another process may take the port between our probe and the bind.
    if (started.ok() || !absl::IsUnavailable(started)) break;
  }
  if (!started.ok()) return started;

  absl::StatusOr<std::string> dsn = CreateDatabase(options_.database);
  if (!dsn.ok()) return dsn.status();
  dsn_ = *dsn;
  return absl::OkStatus();
}

absl::Status TestPostgres::StartServer() {
  ChildOptions c;
  c.argv = {bin_dir_ + "/postgres",
            "-D",
            data_dir_,
            "-p",
            absl::StrCat(port_),
            "-k",
            dir_,
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=32MB",
            "-c",
            "log_min_messages=warning"};
  for (const std::string& setting : options_.settings) {
    c.argv.push_back("-c");
    c.argv.push_back(setting);
  }
  c.cwd = dir_;
  c.log_path = dir_ + "/postgres.log";
  c.switch_user = as_postgres_user_;
  c.uid = uid_;
  c.gid = gid_;
  c.die_with_parent = true;
  absl::StatusOr<pid_t> pid = SpawnChild(c);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  return WaitReady();
}

absl::Status TestPostgres::WaitReady() {
  const auto deadline = std::chrono::steady_clock::now() + kReadyTimeout;
  std::string last_error;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (ChildExited(pid_, &status)) {
      pid_ = -1;
      const std::string log = ServerLogTail();
      const std::string message =
          absl::StrCat("postgres on port ", port_, " exited with status ", status, ":\n", log);
      if (absl::StrContains(log, "could not bind") ||
          absl::StrContains(log, "could not create any TCP/IP sockets")) {
        return absl::UnavailableError(message);
      }
      return absl::FailedPreconditionError(message);
    }
    try {
      pqxx::connection probe(DsnFor("postgres"));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      last_error = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "postgres on port ", port_, " not ready after 30 s: ", last_error, "\n", ServerLogTail()));
}

std::string TestPostgres::ServerLogTail() const { return FileTail(dir_ + "/postgres.log"); }

absl::StatusOr<std::string> TestPostgres::CreateDatabase(absl::string_view name,
                                                         absl::string_view template_database) {
  try {
    pqxx::connection conn(DsnFor("postgres"));
    pqxx::nontransaction n(conn);
    std::string sql = absl::StrCat("CREATE DATABASE ", conn.quote_name(std::string(name)));
    if (!template_database.empty()) {
      absl::StrAppend(&sql, " TEMPLATE ", conn.quote_name(std::string(template_database)));
    }
    n.exec(sql);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("CREATE DATABASE \"", name, "\" on port ", port_, ": ", e.what()));
  }
  return DsnFor(name);
}

absl::StatusOr<int> TestPostgres::TerminateConnections(absl::string_view database) {
  try {
    pqxx::connection conn(DsnFor("postgres"));
    pqxx::nontransaction n(conn);
    const pqxx::row r = n.exec_params1(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' "
        "AND ($1 = '' OR datname = $1)",
        std::string(database));
    return r[0].as<int>();
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("terminating connections on port ", port_, ": ", e.what()));
  }
}

absl::Status TestPostgres::Kill() {
  if (pid_ <= 0) return absl::OkStatus();
  // SIGQUIT: immediate shutdown, what `pg_ctl stop -m immediate` sends.
  kill(pid_, SIGQUIT);
  WaitChild(pid_);
  pid_ = -1;
  return absl::OkStatus();
}

absl::Status TestPostgres::Restart() {
  if (pid_ > 0) return absl::FailedPreconditionError("Restart: the server is running");
  return StartServer();
}

absl::StatusOr<TestPostgres*> SharedTestPostgres() {
  // Destroyed at exit, which stops the server and removes its directory.
  static absl::StatusOr<std::unique_ptr<TestPostgres>> server = TestPostgres::Start();
  if (!server.ok()) return server.status();
  return server->get();
}

absl::StatusOr<std::string> CreateFreshDatabase(absl::string_view prefix,
                                                absl::string_view template_database) {
  static std::atomic<int> counter{0};
  absl::StatusOr<TestPostgres*> server = SharedTestPostgres();
  if (!server.ok()) return server.status();
  return (*server)->CreateDatabase(absl::StrCat(DatabaseNamePart(prefix), "_", ++counter),
                                   template_database);
}

}  // namespace reshard::coordinator::testing
