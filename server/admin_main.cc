// ps-admin: the operator's client for a shard's AdminService (docs/operations.md).
//   ps-admin --address HOST:PORT [credentials] status [--workers]
//   ps-admin --address HOST:PORT [credentials] checkpoint
//   ps-admin --address HOST:PORT [credentials] health [--service NAME]
//   ps-admin secret > FILE                                  (a new cluster secret)
//   ps-admin token --secret-file FILE IDENTITY              (IDENTITY's token under it)
// Credentials: --tls-ca (with --tls-cert/--tls-key for mTLS) and/or --token-file with
// the admin identity's token, or --run-dir of a local shard (its token-admin file)
// (health needs none on the plaintext --health-port, and no admin identity anywhere).
// The token is never sent: ps-admin proves it (net/channel_auth.h) to a shard that first
// proved it holds it too, and refuses to go on with any other listener.
// Prints one JSON object (status --workers: then one per worker, a line each); exit 0 on success (health: SERVING), 1 when the shard refused,
// could not be reached or is not serving, 2 on bad usage.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/escaping.h"
#include "cli/json_line.h"
#include "crypto/cluster_secret.h"
#include "net/channel_auth.h"
#include "net/grpc_credentials.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "ps/v1/ps.grpc.pb.h"

int main(int argc, char** argv) {
  CLI::App app("ps-admin: administrative calls to a ps-server shard", "ps-admin");
  std::string address = "127.0.0.1:7070";
  std::string token_file;
  double timeout_s = 30;
  ps::core::ClientCredentials creds;
  app.add_option("--address", address, "Shard address host:port")->capture_default_str();
  app.add_option("--tls-ca", creds.tls_ca, "CA bundle that signed the shard's certificate (TLS)");
  app.add_option("--tls-cert", creds.tls_cert, "Client certificate (common name admin) for mTLS");
  app.add_option("--tls-key", creds.tls_key, "Key of --tls-cert");
  app.add_option("--tls-server-name", creds.tls_server_name,
                 "Name to check in the shard's certificate instead of the address's host");
  app.add_option("--token-file", token_file, "File holding the admin token");
  std::string run_dir;
  app.add_option("--run-dir", run_dir,
                 "Run directory of a local shard: use its token-admin file");
  app.add_option("--timeout-s", timeout_s, "Deadline of the call in seconds")->capture_default_str();
  app.require_subcommand(1, 1);
  CLI::App* status = app.add_subcommand("status", "Print the shard's state");
  bool workers = false;
  status->add_flag("--workers", workers,
                   "Then one line per worker: its pushes, refusals (late, malformed), slice "
                   "rounds missed and quarantines on this shard");
  CLI::App* checkpoint = app.add_subcommand("checkpoint", "Write a checkpoint now");
  CLI::App* health = app.add_subcommand(
      "health", "grpc.health.v1 Check of one service: \"\" (alive), ps.v1.WorkerService "
                "(admitting workers) or ps.v1.Model (model registered)");
  std::string service;
  health->add_option("--service", service, "Service to check")->capture_default_str();
  CLI::App* secret = app.add_subcommand(
      "secret", "Print a new random cluster secret (for ps-server --secret-file; keep it 0600)");
  CLI::App* token = app.add_subcommand(
      "token", "Print the token of an identity (worker-N, shard-N, admin) under a cluster secret");
  std::string secret_file, identity;
  token->add_option("--secret-file", secret_file, "The cluster secret")->required();
  token->add_option("identity", identity, "worker-N, shard-N or admin")->required();
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const absl::Status& st, int code) {
    std::fprintf(stderr, "ps-admin: %s\n", std::string(st.message()).c_str());
    return code;
  };
  if (*secret) {
    absl::StatusOr<std::string> bytes = ps::crypto::NewSecret();
    if (!bytes.ok()) return fail(bytes.status(), 1);
    std::printf("%s\n", absl::BytesToHexString(*bytes).c_str());
    return 0;
  }
  if (*token) {
    absl::StatusOr<std::string> bytes = ps::crypto::ReadSecretFile(secret_file);
    if (!bytes.ok()) return fail(bytes.status(), 2);
    absl::StatusOr<ps::core::Identity> id = ps::core::ParseIdentity(identity);
    if (!id.ok()) return fail(id.status(), 2);
    std::printf("%s\n", ps::crypto::DeriveToken(*bytes, *id).c_str());
    return 0;
  }
  if (!token_file.empty() || !run_dir.empty()) {
    // The run directory's file is read through the checked directory (no symbolic link,
    // this user's, private).
    absl::StatusOr<std::string> token =
        !token_file.empty()
            ? ps::core::ReadTokenFile(token_file)
            : ps::crypto::ReadRunDirectoryToken(
                  run_dir, ps::core::Identity{ps::core::Identity::Kind::kAdmin, 0});
    if (!token.ok()) {
      std::fprintf(stderr, "ps-admin: %s\n", std::string(token.status().message()).c_str());
      return 2;
    }
    creds.token = *token;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel_creds =
      ps::net::MakeChannelCredentials(creds);
  if (!channel_creds.ok()) {
    std::fprintf(stderr, "ps-admin: %s\n", std::string(channel_creds.status().message()).c_str());
    return 2;
  }
  grpc::ChannelArguments args;
  ps::net::ApplyChannelArguments(creds, &args);
  const auto channel = grpc::CreateCustomChannel(address, *channel_creds, args);
  auto stub = ps::v1::AdminService::NewStub(channel);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  // The admin calls carry the proof of the token; a health check carries nothing.
  ps::net::ChannelAuth auth(channel, creds, address);

  ps::cli::JsonObjectWriter out;
  std::string worker_lines;  // status --workers
  grpc::Status s;
  if (*status) {
    ps::v1::StatusResponse r;
    s = auth.Unary(deadline, /*wait_for_ready=*/false, [&](grpc::ClientContext* ctx) {
      return stub->Status(ctx, ps::v1::StatusRequest(), &r);
    });
    if (s.ok()) {
      out.Add("shard_id", r.shard_id())
          .Add("num_shards", r.num_shards())
          .Add("serving", r.serving())
          .Add("ready", r.ready())
          .Add("layout_hash", static_cast<uint64_t>(r.layout_hash()))
          .Add("min_version", r.min_version())
          .Add("max_version", r.max_version())
          .Add("rounds_closed", r.rounds_closed())
          .Add("pushes_accepted", r.pushes_accepted())
          .Add("refusals", r.refusals())
          .Add("last_checkpoint", r.last_checkpoint())
          .Add("last_checkpoint_unix_s", static_cast<int64_t>(r.last_checkpoint_unix_s()))
          .Add("restored_from", r.restored_from());
      if (workers) {
        // One more line per worker (a flat object each, as the first).
        for (const ps::v1::WorkerStatus& w : r.workers()) {
          ps::cli::JsonObjectWriter line;
          line.Add("worker", w.worker())
              .Add("joined", w.joined())
              .Add("state", w.state())
              .Add("pushes_accepted", w.pushes_accepted())
              .Add("udp_chunks_accepted", w.udp_chunks_accepted())
              .Add("late", w.late())
              .Add("refused", w.refused())
              .Add("malformed", w.malformed())
              .Add("slice_rounds_missed", w.slice_rounds_missed())
              .Add("quarantines", w.quarantines())
              .Add("suspected", w.suspected())
              .Add("windows_suspected", w.windows_suspected())
              .Add("mean_push_latency_seconds", w.mean_push_latency_seconds());
          // JSON has no NaN: null before the worker's first window.
          if (std::isnan(w.suspicion())) {
            line.AddNull("suspicion");
          } else {
            line.Add("suspicion", w.suspicion());
          }
          worker_lines += "\n" + line.str();
        }
      }
    }
  } else if (*health) {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse r;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    s = grpc::health::v1::Health::NewStub(channel)->Check(&ctx, req, &r);
    if (s.ok()) {
      const std::string name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(r.status());
      std::printf("%s\n", out.Add("service", service).Add("status", name).str().c_str());
      return r.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
    }
  } else if (*checkpoint) {
    ps::v1::CheckpointResponse r;
    s = auth.Unary(deadline, /*wait_for_ready=*/false, [&](grpc::ClientContext* ctx) {
      return stub->Checkpoint(ctx, ps::v1::CheckpointRequest(), &r);
    });
    if (s.ok()) out.Add("path", r.path()).Add("version", r.version());
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ps-admin: %s: %s\n", address.c_str(), s.error_message().c_str());
    return 1;
  }
  std::printf("%s%s\n", out.str().c_str(), worker_lines.c_str());
  return 0;
}
