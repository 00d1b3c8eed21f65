#include "server/call_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ps::server {

absl::Status CallBudget::OpenCall(const std::string& client) {
  absl::MutexLock lock(&mu_);
  Client& c = clients_[client];
  if (c.calls >= limits_.max_calls_per_client) {
    DropClientIfIdleLocked(client);
    return absl::ResourceExhaustedError(absl::StrCat(
        client, " has ", limits_.max_calls_per_client,
        " calls open on this port, the most --max-calls-per-client allows; wait for one to end"));
  }
  ++c.calls;
  return absl::OkStatus();
}

void CallBudget::CloseCall(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end() || it->second.calls == 0) return;
  --it->second.calls;
  DropClientIfIdleLocked(client);
}

CallBudget::Ticket CallBudget::RequestRead(const std::string& client, Start start) {
  std::vector<std::pair<Ticket, Start>> run;
  Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = next_++;
    waiting_.push_back(Waiting{ticket, client, std::move(start)});
    run = StartWaitingLocked();
  }
  for (auto& [t, fn] : run) std::move(fn)(t);
  return ticket;
}

void CallBudget::ReadDone(Ticket ticket) {
  std::vector<std::pair<Ticket, Start>> run;
  {
    absl::MutexLock lock(&mu_);
    auto it = reads_.find(ticket);
    if (it == reads_.end()) return;
    auto c = clients_.find(it->second.client);
    if (c != clients_.end() && c->second.reading > 0) --c->second.reading;
    const std::string client = it->second.client;
    reads_.erase(it);
    --reading_;
    DropClientIfIdleLocked(client);
    run = StartWaitingLocked();
  }
  for (auto& [t, fn] : run) std::move(fn)(t);
}

bool CallBudget::CancelRead(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->ticket == ticket) {
      waiting_.erase(it);
      return true;
    }
  }
  return false;
}

std::vector<CallBudget::Ticket> CallBudget::Overdue(core::SteadyTime now) const {
  std::vector<Ticket> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [ticket, r] : reads_) {
    if (now - r.since >= limits_.read_timeout) out.push_back(ticket);
  }
  return out;
}

CallBudget::Stats CallBudget::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  s.clients = static_cast<uint32_t>(clients_.size());
  for (const auto& [name, c] : clients_) s.calls += c.calls;
  s.reading = reading_;
  s.waiting = static_cast<uint32_t>(waiting_.size());
  return s;
}

std::vector<std::pair<CallBudget::Ticket, CallBudget::Start>> CallBudget::StartWaitingLocked() {
  std::vector<std::pair<Ticket, Start>> run;
  const core::SteadyTime now = clock_->Now();
  for (auto it = waiting_.begin(); it != waiting_.end() && reading_ < limits_.max_reads;) {
    Client& c = clients_[it->client];
    if (c.reading >= limits_.max_reads_per_client) {
      ++it;  // this client waits for one of its own reads; others may go first
      continue;
    }
    ++c.reading;
    ++reading_;
    reads_.emplace(it->ticket, Reading{it->client, now});
    run.emplace_back(it->ticket, std::move(it->start));
    it = waiting_.erase(it);
  }
  return run;
}

void CallBudget::DropClientIfIdleLocked(const std::string& client) {
  auto it = clients_.find(client);
  if (it != clients_.end() && it->second.calls == 0 && it->second.reading == 0) clients_.erase(it);
}

}  // namespace ps::server
