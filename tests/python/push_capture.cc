// ps-test-push-capture: the C++ side of the Python push-parity test
// (tests/python/test_parity.py).
//
//   ps-test-push-capture proxy --upstream HOST:PORT --port-file F --out DIR
//     A transparent gRPC proxy on a free loopback port (written to F once it serves):
//     every call, of any method, is forwarded to the upstream shard with its metadata
//     (tokens), and every ps.v1.WorkerService/Push request is also written to
//     DIR/push-S-R.bin (S its slice, R its round), with the session token the shard
//     issued cleared and everything else as it came, payload bytes included. Runs until
//     SIGTERM/SIGINT.
//
//   ps-test-push-capture push --shards A,B --worker-id W --token-file F
//       --tensors name:numel:codec,... --grads FILE --rounds R [--error-feedback]
//       [--codec-seed S] [--slice-elems N]
//     A C++ ps::Worker pushes, for each round, the gradients read from FILE (float32,
//     rounds x tensors in order), waits for the pushes, then pulls the next version;
//     the initial parameters are zeros.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/credentials.h"
#include "core/layout.h"
#include "ps/v1/ps.pb.h"
#include "worker_lib/worker.h"

namespace {

constexpr char kPush[] = "/ps.v1.WorkerService/Push";

std::string Flatten(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!b.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

void Record(const std::string& dir, const grpc::ByteBuffer& request) {
  ps::v1::PushRequest push;
  if (!push.ParseFromString(Flatten(request))) {
    std::cerr << "push-capture: a Push request that does not parse\n";
    return;
  }
  push.clear_session();  // issued by the shard at join: differs between runs
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  {
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    push.SerializeToCodedStream(&out);
  }
  const std::string path = absl::StrCat(dir, "/push-", push.slice_id(), "-", push.round(), ".bin");
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One proxied call: the server side (toward the worker) and the client side (toward the
// shard) relay messages one at a time in both directions; the call ends with the
// shard's status. The upstream call holds one hold per direction, each removed once
// that direction will start no more operations on it: its OnDone destroys its stream
// and finishes the server side (after which the Relay may be deleted), so it must not
// come while the other side could still start a read or write on it. Deletes itself
// once both sides are done (the server side's OnDone, which follows Finish, is last).
// Relays alive: the proxy exits only once none is (an upstream call cancelled by the
// server's shutdown ends later, and its reactor must not outlive the server and channel).
std::atomic<int> g_live_relays{0};

class Relay final : public grpc::ServerGenericBidiReactor {
 public:
  Relay(grpc::GenericCallbackServerContext* ctx, grpc::GenericStub* stub, std::string out_dir)
      : method_(ctx->method()), out_dir_(std::move(out_dir)), upstream_(this) {
    g_live_relays.fetch_add(1);
    for (const auto& [key, value] : ctx->client_metadata()) {
      const std::string k(key.data(), key.size());
      if (k.empty() || k[0] == ':' || k.rfind("grpc-", 0) == 0) continue;
      client_ctx_.AddMetadata(k, std::string(value.data(), value.size()));
    }
    client_ctx_.set_deadline(ctx->deadline());
    stub->PrepareBidiStreamingCall(&client_ctx_, method_, grpc::StubOptions(), &upstream_);
    upstream_.AddMultipleHolds(2);  // the request and the response direction
    upstream_.StartRead(&response_);
    upstream_.StartCall();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      if (method_ == kPush) Record(out_dir_, request_);
      upstream_.StartWrite(&request_);
      return;
    }
    upstream_.StartWritesDone();
    upstream_.RemoveHold();  // no more requests
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      upstream_.StartRead(&response_);
      return;
    }
    // The worker's side is gone: end the upstream call rather than leave its
    // responses unread (they would hold the shared connection's flow-control window).
    client_ctx_.TryCancel();
    upstream_.RemoveHold();  // no more responses
  }
  void OnCancel() override { client_ctx_.TryCancel(); }
  void OnDone() override { Release(); }

 private:
  class Upstream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Upstream(Relay* relay) : relay_(relay) {}
    void OnWriteDone(bool ok) override {
      if (ok) {
        // The next request (none: the worker half-closes after its one message).
        relay_->StartRead(&relay_->request_);
        return;
      }
      RemoveHold();  // the shard's side is gone: no more requests
    }
    void OnReadDone(bool ok) override {
      if (ok) {
        relay_->StartWrite(&relay_->response_);
        return;
      }
      RemoveHold();  // the shard's last response came: no more responses
    }
    // Both directions are over: no operation on either side is outstanding.
    void OnDone(const grpc::Status& s) override {
      relay_->Finish(s);
      relay_->Release();
    }

   private:
    Relay* const relay_;
  };

  void Release() {
    if (--pending_ == 0) {
      delete this;
      g_live_relays.fetch_sub(1);
    }
  }

  const std::string method_;
  const std::string out_dir_;
  grpc::ClientContext client_ctx_;
  Upstream upstream_;
  grpc::ByteBuffer request_, response_;
  std::atomic<int> pending_{2};  // the two sides' OnDone
};

class Proxy final : public grpc::CallbackGenericService {
 public:
  Proxy(const std::string& upstream, std::string out_dir) : out_dir_(std::move(out_dir)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    stub_ = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(upstream, grpc::InsecureChannelCredentials(), args));
  }
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new Relay(ctx, stub_.get(), out_dir_);
  }

 private:
  const std::string out_dir_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

std::atomic<bool> g_stop{false};

int RunProxy(const std::string& upstream, const std::string& port_file, const std::string& out) {
  Proxy proxy(upstream, out);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // port 0 never shared
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterCallbackGenericService(&proxy);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "push-capture: cannot listen on 127.0.0.1\n";
    return 1;
  }
  {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::signal(SIGTERM, [](int) { g_stop = true; });
  std::signal(SIGINT, [](int) { g_stop = true; });
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  for (int i = 0; i < 500 && g_live_relays.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (const int live = g_live_relays.load(); live > 0) {
    // Their reactors use the server and the channel: exit without destroying either.
    std::cerr << "push-capture: " << live << " calls still relayed 5 s after shutdown\n";
    std::_Exit(3);
  }
  return 0;
}

struct PushArgs {
  std::string shards, token_file, tensors, grads;
  uint32_t worker_id = 0, rounds = 1, slice_elems = ps::core::kDefaultSliceElems;
  uint64_t codec_seed = 0;
  bool error_feedback = false;
};

int RunPush(const PushArgs& a) {
  std::vector<ps::core::TensorSpec> specs;
  ps::WorkerOptions o;
  o.shard_addresses = absl::StrSplit(a.shards, ',');
  o.worker_id = a.worker_id;
  o.codec_seed = a.codec_seed;
  if (!a.token_file.empty()) {
    auto token = ps::core::ReadTokenFile(a.token_file);
    if (!token.ok()) {
      std::cerr << token.status() << "\n";
      return 1;
    }
    o.credentials.token = *token;
  }
  size_t total = 0;
  for (absl::string_view item : absl::StrSplit(a.tensors, ',')) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    uint64_t numel = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &numel)) {
      std::cerr << "push-capture: --tensors wants name:numel:codec, got '" << item << "'\n";
      return 2;
    }
    specs.push_back({parts[0], numel, static_cast<int32_t>(specs.size())});
    ps::PushOptions p;
    p.codec = parts[2];
    p.error_feedback = a.error_feedback;
    o.tensor_push[parts[0]] = p;
    total += numel;
  }
  auto layout = ps::core::ModelLayout::Create(specs, a.slice_elems,
                                              static_cast<uint32_t>(o.shard_addresses.size()));
  if (!layout.ok()) {
    std::cerr << layout.status() << "\n";
    return 2;
  }
  std::vector<float> grads(total * a.rounds);
  std::ifstream in(a.grads, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(grads.data()),
               static_cast<std::streamsize>(grads.size() * sizeof(float)))) {
    std::cerr << "push-capture: " << a.grads << " holds fewer than " << grads.size() << " floats\n";
    return 2;
  }
  // The first worker to join brings the initial parameters: zeros.
  std::vector<float> params(total);
  std::vector<std::span<const float>> initial;
  for (size_t t = 0, off = 0; t < specs.size(); off += specs[t].numel, ++t) {
    initial.emplace_back(params.data() + off, specs[t].numel);
  }
  auto worker = ps::Worker::Start(o, *layout, initial);
  if (!worker.ok()) {
    std::cerr << worker.status() << "\n";
    return 1;
  }
  for (uint32_t r = 0; r < a.rounds; ++r) {
    size_t at = r * total;
    for (size_t t = 0; t < specs.size(); ++t) {
      std::span<const float> g(grads.data() + at, specs[t].numel);
      at += specs[t].numel;
      if (absl::Status s = (*worker)->Push(t, r, g); !s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
    }
    if (absl::Status s = (*worker)->WaitPushes(); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
    size_t off = 0;
    for (size_t t = 0; t < specs.size(); ++t) {
      std::span<float> out(params.data() + off, specs[t].numel);
      off += specs[t].numel;
      if (auto v = (*worker)->Pull(t, r + 1, out, std::chrono::seconds(30)); !v.ok()) {
        std::cerr << v.status() << "\n";
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The C++ side of the Python push-parity test"};
  app.require_subcommand(1);
  std::string upstream, port_file, out;
  CLI::App* proxy = app.add_subcommand("proxy", "A recording gRPC proxy in front of a shard");
  proxy->add_option("--upstream", upstream)->required();
  proxy->add_option("--port-file", port_file)->required();
  proxy->add_option("--out", out)->required();
  PushArgs a;
  CLI::App* push = app.add_subcommand("push", "Pushes gradients from a file with ps::Worker");
  push->add_option("--shards", a.shards)->required();
  push->add_option("--worker-id", a.worker_id);
  push->add_option("--token-file", a.token_file);
  push->add_option("--tensors", a.tensors)->required();
  push->add_option("--grads", a.grads)->required();
  push->add_option("--rounds", a.rounds);
  push->add_option("--slice-elems", a.slice_elems);
  push->add_option("--codec-seed", a.codec_seed);
  push->add_flag("--error-feedback", a.error_feedback);
  CLI11_PARSE(app, argc, argv);
  if (*proxy) return RunProxy(upstream, port_file, out);
  return RunPush(a);
}
