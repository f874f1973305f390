// gRPC adapter for AuthService (bearer tokens; admin only, as every method
// the Authorizer's table does not name): each handler passes the Authorizer,
// then calls TokenApi. Thread-safe.
#pragma once

#include "reshard/v1/coordinator.grpc.pb.h"
#include "services/coordinator/logic/tokens.h"
#include "services/coordinator/metrics/metrics.h"
#include "services/coordinator/server/auth.h"

namespace reshard::coordinator {

class AuthServiceImpl final : public v1::AuthService::Service {
 public:
  /// `api` and `authorizer` must outlive this; `metrics` may be null.
  AuthServiceImpl(TokenApi* api, const Authorizer* authorizer, CoordinatorMetrics* metrics)
      : api_(api), authorizer_(authorizer), metrics_(metrics) {}

  grpc::Status CreateToken(grpc::ServerContext* context, const v1::CreateTokenRequest* request,
                           v1::CreateTokenResponse* reply) override;
  grpc::Status RevokeToken(grpc::ServerContext* context, const v1::RevokeTokenRequest* request,
                           v1::Token* reply) override;
  grpc::Status ListTokens(grpc::ServerContext* context, const v1::ListTokensRequest* request,
                          v1::ListTokensResponse* reply) override;

 private:
  TokenApi* api_;
  const Authorizer* authorizer_;
  CoordinatorMetrics* metrics_;
};

}  // namespace reshard::coordinator
