#include "services/coordinator/server/auth_service.h"

#include <vector>

#include "services/coordinator/server/rpc_status.h"

namespace reshard::coordinator {
namespace {

v1::Token ToProto(const TokenRecord& r) {
  v1::Token t;
  t.set_id(r.id);
  t.set_name(r.name);
  t.set_role(r.role);
  for (const std::string& tenant : r.tenants) t.add_tenants(tenant);
  t.set_created_by(r.created_by);
  t.set_created_unix_ms(r.created_unix_ms);
  t.set_expires_unix_ms(r.expires_unix_ms);
  t.set_revoked_unix_ms(r.revoked_unix_ms.value_or(0));
  return t;
}

}  // namespace

grpc::Status AuthServiceImpl::CreateToken(grpc::ServerContext* context,
                                          const v1::CreateTokenRequest* request,
                                          v1::CreateTokenResponse* reply) {
  return RunAdmitted(
      authorizer_, context, metrics_, "CreateToken", *request, "", [&](const Principal& p) {
        if (request->ttl_seconds() < 0 || request->ttl_seconds() > TokenApi::kMaxTtlMs / 1000) {
          return absl::InvalidArgumentError("ttl_seconds is out of range");
        }
        absl::StatusOr<TokenApi::Created> created = api_->Create(
            request->name(), request->role(),
            std::vector<std::string>(request->tenants().begin(), request->tenants().end()),
            request->ttl_seconds() * 1000, p.name);
        if (!created.ok()) return created.status();
        *reply->mutable_token() = ToProto(created->record);
        reply->set_bearer_token(created->token);
        return absl::OkStatus();
      });
}

grpc::Status AuthServiceImpl::RevokeToken(grpc::ServerContext* context,
                                          const v1::RevokeTokenRequest* request, v1::Token* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "RevokeToken", *request, "",
                     [&](const Principal&) {
                       absl::StatusOr<TokenRecord> revoked = api_->Revoke(request->token_id());
                       if (!revoked.ok()) return revoked.status();
                       *reply = ToProto(*revoked);
                       return absl::OkStatus();
                     });
}

grpc::Status AuthServiceImpl::ListTokens(grpc::ServerContext* context,
                                         const v1::ListTokensRequest* request,
                                         v1::ListTokensResponse* reply) {
  return RunAdmitted(authorizer_, context, metrics_, "ListTokens", *request, "",
                     [&](const Principal&) {
                       absl::StatusOr<std::vector<TokenRecord>> tokens = api_->List();
                       if (!tokens.ok()) return tokens.status();
                       for (const TokenRecord& t : *tokens) *reply->add_tokens() = ToProto(t);
                       return absl::OkStatus();
                     });
}

}  // namespace reshard::coordinator
