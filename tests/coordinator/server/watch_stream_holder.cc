// A viewer in a process of its own, for tests that end a client by killing
// it (watch_limits_test.cc): opens COUNT WatchJob streams of JOB_ID at
// ADDRESS with the certificate CERT/KEY (chained to CA), reads each one's
// first message, then waits to be killed. Exit status 1 (with the reason on
// stderr) when a stream cannot be opened.
//
// usage: watch_stream_holder ADDRESS JOB_ID COUNT CA CERT KEY
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "reshard/v1/coordinator.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s ADDRESS JOB_ID COUNT CA CERT KEY\n", argv[0]);
    return 2;
  }
  reshard::TlsFiles files;
  files.ca = argv[4];
  files.cert = argv[5];
  files.key = argv[6];
  auto creds = reshard::MakeChannelCredentials(files);
  if (!creds.ok()) {
    std::fprintf(stderr, "credentials: %s\n", std::string(creds.status().message()).c_str());
    return 1;
  }
  auto stub = reshard::v1::CoordinatorService::NewStub(grpc::CreateChannel(argv[1], *creds));
  struct Open {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<reshard::v1::Job>> reader;
  };
  std::vector<std::unique_ptr<Open>> open;
  const int count = std::atoi(argv[3]);
  for (int i = 0; i < count; ++i) {
    auto s = std::make_unique<Open>();
    reshard::v1::WatchJobRequest request;
    request.set_job_id(argv[2]);
    s->reader = stub->WatchJob(&s->context, request);
    reshard::v1::Job first;
    if (!s->reader->Read(&first)) {
      const grpc::Status status = s->reader->Finish();
      std::fprintf(stderr, "stream %d: %d %s\n", i, status.error_code(),
                   status.error_message().c_str());
      return 1;
    }
    open.push_back(std::move(s));
  }
  std::printf("holding %d streams\n", count);
  std::fflush(stdout);
  for (;;) pause();
}
