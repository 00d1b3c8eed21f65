#include "bench/hostile_cover.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <latch>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "codecs/codec.h"

namespace ps::bench {

using std::chrono::milliseconds;

// One slice's pushes of a poisoned round, made before the round opens so that the
// client's encoding is not on the round's critical path.
struct Cover::Poisoned {
  std::string garbage_spec, garbage;  // refused by the decoder, after the shard made it
  std::string spec, encoded;          // a valid push under a new spec
};

// One push in flight.
struct Cover::PushCall {
  grpc::ClientContext ctx;
  v1::PushRequest req;
  v1::PushResponse resp;
  grpc::Status status;
};

namespace {
const std::string kFp32 = "fp32";
}  // namespace

Cover::Cover(Attacker& attacker, const harness::HonestTraining& training, const core::ModelLayout& layout,
             SpecSource& specs)
    : attacker_(attacker), training_(training), layout_(layout), specs_(specs) {
  for (const core::SliceInfo& s : layout_.slices()) {
    std::string payload(1 + size_t{s.numel} * 4, '\0');
    payload[0] = '\x01';
    const std::vector<float> values(s.numel, 2e-4f);
    std::memcpy(payload.data() + 1, values.data(), values.size() * 4);
    payloads_.push_back(std::move(payload));
  }
  thread_ = std::thread([this] { Loop(); });
}

Cover::~Cover() {
  stop_.store(true);
  thread_.join();
  SetPoison(nullptr);  // the garbage pushes' callbacks use this object
}

void Cover::SetPoison(Tally* tally) {
  std::unique_lock lock(garbage_mu_);
  poison_ = tally;
  garbage_done_.wait(lock, [&] { return poison_ != nullptr || garbage_open_ == 0; });
}

std::vector<Cover::Poisoned> Cover::PreparePoison(uint64_t round, std::mt19937_64& rng) {
  std::vector<Poisoned> out;
  for (const core::SliceInfo& s : layout_.slices()) {
    Poisoned p;
    p.garbage_spec = specs_.Next();
    p.garbage = Garbage(rng, 4 * size_t{s.numel});
    p.spec = specs_.Next();
    absl::StatusOr<std::unique_ptr<codecs::Codec>> c = codecs::MakeCodec(p.spec);
    const std::vector<float> values(s.numel, 2e-4f);
    if (!c.ok() ||
        !(*c)->Encode(values, codecs::EncodeContext{round, s.id, kAttackerId}, &p.encoded).ok()) {
      p.spec = "fp32";
      p.encoded = payloads_[s.id];
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::unique_ptr<Cover::PushCall> Cover::MakePush(uint64_t round, uint32_t slice,
                                                 const std::string& codec,
                                                 const std::string& payload) const {
  auto c = std::make_unique<PushCall>();
  c->req.set_session(attacker_.session());
  c->req.set_layout_hash(attacker_.layout_hash());
  c->req.set_round(round);
  c->req.set_slice_id(slice);
  c->req.set_codec(codec);
  c->req.set_payload(payload);
  Prepare(c->ctx, attacker_.token());
  return c;
}

Tally* Cover::Poison() {
  std::lock_guard lock(garbage_mu_);
  return poison_;
}

// Sends a garbage push without waiting: its answer is counted on `tally` when it comes.
void Cover::SendGarbage(v1::WorkerService::Stub& stub, std::unique_ptr<PushCall> call,
                        Tally* tally) {
  PushCall* c = call.release();
  stub.async()->Push(&c->ctx, &c->req, &c->resp, [this, c, tally](grpc::Status s) {
    tally->Count(s);
    delete c;
    std::lock_guard lock(garbage_mu_);
    --garbage_open_;
    garbage_done_.notify_all();
  });
}

// Sends every call at once, in order, and waits for all the answers.
void Cover::SendAll(v1::WorkerService::Stub& stub,
                    const std::vector<std::unique_ptr<PushCall>>& calls) {
  std::latch done(std::ptrdiff_t(calls.size()));
  for (const std::unique_ptr<PushCall>& c : calls) {
    stub.async()->Push(&c->ctx, &c->req, &c->resp, [&done, p = c.get()](grpc::Status s) {
      p->status = std::move(s);
      done.count_down();
    });
  }
  done.wait();
}

void Cover::Loop() {
  std::unique_ptr<v1::WorkerService::Stub> stub =
      v1::WorkerService::NewStub(OwnChannel(attacker_.address()));
  std::mt19937_64 rng(7);
  std::vector<Poisoned> poisoned;
  uint64_t next = 0;
  while (!stop_.load()) {
    if (Poison() != nullptr && poisoned.empty()) poisoned = PreparePoison(next, rng);
    if (!training_.WaitOpen(next, milliseconds(100))) continue;
    const uint64_t round = std::max(next, training_.open_version());
    std::vector<std::unique_ptr<PushCall>> calls;
    Tally* poison = nullptr;
    {
      // Read with the garbage counted in flight under one lock: SetPoison(nullptr)
      // then waits for every push that counts on the tally.
      std::lock_guard lock(garbage_mu_);
      poison = poison_;
      if (poison != nullptr) garbage_open_ += static_cast<uint32_t>(layout_.slices().size());
    }
    if (poison != nullptr && poisoned.empty()) poisoned = PreparePoison(round, rng);
    // Every slice at once; under poison each valid push right behind its garbage one.
    for (const core::SliceInfo& s : layout_.slices()) {
      if (poison != nullptr) {
        SendGarbage(*stub,
                    MakePush(round, s.id, poisoned[s.id].garbage_spec, poisoned[s.id].garbage),
                    poison);
        calls.push_back(MakePush(round, s.id, poisoned[s.id].spec, poisoned[s.id].encoded));
      } else {
        calls.push_back(MakePush(round, s.id, kFp32, payloads_[s.id]));
      }
    }
    SendAll(*stub, calls);
    for (const std::unique_ptr<PushCall>& call : calls) {
      PushCall& c = *call;
      // A join by an attack may have replaced the session meanwhile (the shard may know
      // the new one before the joining thread does): retry with the newest one.
      grpc::Status st = c.status;
      for (int attempt = 0;
           attempt < 50 && st.error_code() == grpc::StatusCode::UNAUTHENTICATED && !stop_.load();
           ++attempt) {
        if (attacker_.session() == c.req.session())
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::unique_ptr<PushCall> again =
            MakePush(round, c.req.slice_id(), c.req.codec(), c.req.payload());
        st = stub->Push(&again->ctx, again->req, &again->resp);
        c.req.set_session(again->req.session());
      }
      if (st.ok()) {
        counts_.Pushed();
      } else {
        counts_.Refused(absl::StrCat(CodeName(int(st.error_code())), ": ", st.error_message()));
      }
    }
    if (poison != nullptr) poisoned.clear();
    next = round + 1;
  }
}

}  // namespace ps::bench
