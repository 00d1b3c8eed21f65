// `ps-bench auth`: what authenticating a call costs, on one thread, against the bearer
// check the shards made before tokens were proven (issue 45; docs/operations.md,
// "Mutual authentication"). A shard checks every call twice, in the port's metadata
// processor and in the handler (server/metadata_auth.h), so a call costs two "proof"
// rows; a client's first call to a shard process costs one challenge round trip.
//
// Rows: the old bearer checks (a derived token: its HMAC; a --tokens token: its SHA-256
// and a table lookup) as the baseline; the proof checks (the table made at start, and a
// worker beyond it, derived per call); refusals of a wrong and of a stale proof; a
// challenge answered; and a challenge's round trip on loopback to an in-process shard,
// through net::ChannelAuth, the client's object.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "bench/commands.h"
#include "core/status.h"
#include "crypto/auth_proof.h"
#include "crypto/cluster_secret.h"
#include "net/channel_auth.h"
#include "server/auth_internal.h"
#include "server/local_cluster.h"
#include "server/server.h"

namespace ps::bench {
namespace {

struct AuthFlags {
  double min_seconds = 0.2;
  int repeats = 5;
  std::string json;
  bool quick = false;
};

using Kind = core::Identity::Kind;

// The call header an honest client of `auth` sends for `token`.
absl::StatusOr<std::string> Prove(const server::Authenticator& auth, const std::string& token) {
  const std::string key = crypto::TokenKey(token);
  PS_ASSIGN_OR_RETURN(const std::string nonce, crypto::NewNonce());
  PS_ASSIGN_OR_RETURN(const std::string answer,
                      auth.AnswerChallenge(crypto::ChallengeHeader(key, nonce)));
  std::optional<crypto::ChallengeReply> r = crypto::ParseChallengeAnswer(answer);
  if (!r.has_value()) return absl::InternalError("a malformed answer: " + answer);
  return crypto::ProofHeader(key, r->server_nonce,
                           crypto::CallProof(token, key, r->server.Name(), r->server_nonce));
}

int RunAuth(const AuthFlags& f) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("ps-bench-auth-", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string listed(64, '7');  // a --tokens token (openssl rand -hex 32 sized)
  std::ofstream(dir / "tokens") << "worker-1 " << listed << "\n";
  server::ServerOptions o;
  o.num_workers = 16;
  o.tokens_file = (dir / "tokens").string();
  o.run_dir = (dir / "run").string();
  const auto fail = [&](const absl::Status& st) {
    std::fprintf(stderr, "ps-bench auth: %s\n", std::string(st.message()).c_str());
    std::filesystem::remove_all(dir);
    return 1;
  };
  absl::StatusOr<std::unique_ptr<server::Authenticator>> made = server::Authenticator::Create(o);
  if (!made.ok()) return fail(made.status());
  const server::Authenticator& auth = **made;
  absl::StatusOr<std::string> secret = crypto::LoadOrCreateSecret(o.run_dir);
  if (!secret.ok()) return fail(secret.status());
  const std::string derived = crypto::DeriveToken(*secret, {Kind::kWorker, 0});
  const std::string beyond = crypto::DeriveToken(*secret, {Kind::kWorker, 5000});
  absl::StatusOr<server::TokenTable> table =
      server::TokenTable::Parse(absl::StrCat("worker-1 ", listed, "\n"), "tokens");
  absl::StatusOr<std::string> proof = Prove(auth, derived);
  absl::StatusOr<std::string> listed_proof = Prove(auth, listed);
  absl::StatusOr<std::string> beyond_proof = Prove(auth, beyond);
  auto restarted = server::Authenticator::Create(o);  // another process of the shard
  for (const absl::Status& st : {table.status(), proof.status(), listed_proof.status(),
                                 beyond_proof.status(), restarted.status()}) {
    if (!st.ok()) return fail(st);
  }
  absl::StatusOr<std::string> stale = Prove(**restarted, derived);
  if (!stale.ok()) return fail(stale.status());
  std::string wrong = *proof;
  wrong.back() = wrong.back() == '0' ? '1' : '0';
  const std::string challenge = crypto::ChallengeHeader("worker-0", std::string(32, 'c'));
  const std::string challenge_beyond = crypto::ChallengeHeader("worker-5000", std::string(32, 'c'));

  const auto accepts = [&](const std::string& header) {
    return [&auth, header]() -> absl::Status {
      return auth.Verify({std::nullopt, header}).status();
    };
  };
  const auto refuses = [&](const std::string& header) {
    return [&auth, header]() -> absl::Status {
      return auth.Verify({std::nullopt, header}).ok() ? absl::InternalError("accepted")
                                                      : absl::OkStatus();
    };
  };
  struct Row {
    std::string name;
    std::function<absl::Status()> fn;
  };
  const std::vector<Row> rows = {
      {"bearer, derived token (before)",
       [&]() -> absl::Status {
         return crypto::VerifyDerivedToken(*secret, derived).has_value()
                    ? absl::OkStatus()
                    : absl::InternalError("refused");
       }},
      {"bearer, --tokens token (before)",
       [&]() -> absl::Status {
         return table->Find(listed).has_value() ? absl::OkStatus() : absl::InternalError("refused");
       }},
      {"proof, derived key", accepts(*proof)},
      {"proof, --tokens key", accepts(*listed_proof)},
      {"proof, worker beyond the start table", accepts(*beyond_proof)},
      {"wrong proof refused", refuses(wrong)},
      {"stale proof refused", refuses(*stale)},
      {"challenge answered",
       [&]() -> absl::Status { return auth.AnswerChallenge(challenge).status(); }},
      {"challenge answered, worker beyond the start table",
       [&]() -> absl::Status { return auth.AnswerChallenge(challenge_beyond).status(); }},
  };
  TimingOptions timing;
  timing.repeats = f.quick ? 1 : f.repeats;
  timing.min_seconds = f.quick ? 0.01 : f.min_seconds;
  Table out({"check", "ns per call (median)", "ratio to derived bearer"});
  std::vector<cli::JsonObjectWriter> json;
  double baseline = 0;
  int errors = 0;
  const auto report = [&](const std::string& name, double seconds) {
    if (baseline == 0) baseline = seconds;
    out.AddRow({name, FormatG(seconds * 1e9, 4), FormatG(seconds / baseline, 3)});
    json.push_back(cli::JsonObjectWriter()
                       .Add("check", name)
                       .Add("ns_per_call", seconds * 1e9)
                       .Add("ratio_to_derived_bearer", seconds / baseline));
  };
  for (const Row& row : rows) {
    absl::StatusOr<Timing> t = TimeCalls(row.fn, timing);
    if (!t.ok()) {
      std::fprintf(stderr, "ps-bench auth: %s: %s\n", row.name.c_str(),
                   std::string(t.status().message()).c_str());
      ++errors;
      continue;
    }
    report(row.name, t->median_seconds);
  }

  // The client's side: a challenge's round trip to a shard on loopback, each through a
  // new ChannelAuth (as a fresh worker, peer or ps-admin makes), on one channel.
  server::ServerOptions so;
  so.num_workers = 1;
  so.log_level = "warn";
  absl::StatusOr<server::LocalCluster> cluster = server::LocalCluster::Start(1, so);
  if (!cluster.ok()) return fail(cluster.status());
  absl::StatusOr<std::string> token = cluster->WorkerToken(0);
  if (!token.ok()) return fail(token.status());
  core::ClientCredentials creds;
  creds.token = *token;
  const std::string address = cluster->addresses()[0];
  const auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  absl::StatusOr<Timing> rtt = TimeCalls(
      [&]() -> absl::Status {
        net::ChannelAuth auth_client(channel, creds, address, core::Identity{Kind::kShard, 0});
        grpc::ClientContext ctx;
        const grpc::Status s =
            auth_client.Attach(&ctx, std::chrono::system_clock::now() + std::chrono::seconds(10));
        return s.ok() ? absl::OkStatus() : absl::UnavailableError(s.error_message());
      },
      timing);
  if (!rtt.ok()) {
    std::fprintf(stderr, "ps-bench auth: challenge round trip: %s\n",
                 std::string(rtt.status().message()).c_str());
    ++errors;
  } else {
    report("challenge round trip, loopback (client)", rtt->median_seconds);
  }
  cluster->Stop();
  std::filesystem::remove_all(dir);
  return FinishReport("auth", out, "", {}, f.json, json, errors);
}

}  // namespace

Command AddAuthCommand(CLI::App& app) {
  auto f = std::make_shared<AuthFlags>();
  CLI::App* sub = app.add_subcommand(
      "auth", "Cost of a call's authentication: proof checks, refusals and challenges against "
              "the bearer check of before, same run, one thread");
  sub->add_option("--min-seconds", f->min_seconds, "Least time of each timed repeat")
      ->capture_default_str();
  sub->add_option("--repeats", f->repeats, "Timed repeats per row (the median is reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  sub->add_option("--json", f->json, "Also write the rows as a JSON array to FILE")
      ->option_text("FILE");
  sub->add_flag("--quick", f->quick, "Tiny run for smoke tests");
  return Command{.app = sub, .run = [f] { return RunAuth(*f); }};
}

}  // namespace ps::bench
