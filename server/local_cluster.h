// LocalCluster: ps-server shards started in this process on loopback ports, for tests,
// benchmarks and examples (docs/architecture.md, "A local cluster"). It owns the shards
// and, when it made one, their temporary run directory; it gives their addresses and the
// workers' tokens; its destructor shuts the shards down and then removes the directory.
//
// PickFreePorts is also for launchers that start ps-server as child processes
// (examples/fashion_mnist/demo.cc).
//
// Free of gRPC types. The const methods may be called from several threads at once; the
// others (start, Shutdown, Stop, moves, destruction) from one thread, with no const call
// running. The Servers it hands out are thread-safe (server/server.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/options.h"

namespace ps::server {

class Server;

// Ports that were free on 127.0.0.1 a moment ago: binds `count` sockets to port 0 at
// once (so the ports differ), reads them and closes the sockets. Another process may
// take one before it is used. A failing socket, bind or getsockname is the error.
absl::StatusOr<std::vector<uint16_t>> PickFreePorts(size_t count);

// Gives `count` ports for a cluster's shards; PickFreePorts unless a caller knows better.
using PortPicker = std::function<absl::StatusOr<std::vector<uint16_t>>(size_t count)>;

class LocalCluster {
 public:
  // Starts `num_shards` shards on 127.0.0.1, all with `base` options and with host, port,
  // shard id, shard count and (for several shards) peers filled in; "{shard}" in
  // `base.tls_cert` and `tls_key` becomes each shard's id (its own certificate). Unless `base` says
  // how to authenticate (or is insecure), the shards use a fresh private run directory,
  // as ps-server does by default, removed with the cluster: clients then need
  // WorkerToken. One shard binds a port the kernel picks; several get ports from
  // `pick_ports` beforehand (each must know the others' addresses). A shard that cannot
  // listen on its port (another process took it in between) stops the shards started so
  // far, and all start again on newly picked ports, four attempts in all. On failure the
  // shards started so far are stopped and the directory is removed; the error names the
  // shard.
  static absl::StatusOr<LocalCluster> Start(uint32_t num_shards, ServerOptions base,
                                            const PortPicker& pick_ports = PickFreePorts);

  // No shards.
  LocalCluster();
  LocalCluster(LocalCluster&& other) noexcept;
  LocalCluster& operator=(LocalCluster&& other) noexcept;
  // Stop().
  ~LocalCluster();

  size_t num_shards() const { return shards_.size(); }
  // Shard `i` (< num_shards()); lives as long as the cluster.
  Server& shard(size_t i) const;
  // "127.0.0.1:PORT" of each shard, by shard id.
  const std::vector<std::string>& addresses() const { return addresses_; }
  // The shards' run directory (made by Start or given in `base`); empty when they
  // authenticate otherwise or not at all.
  const std::string& run_dir() const { return run_dir_; }
  // The token of worker `id` from the run directory; "" without a run directory.
  absl::StatusOr<std::string> WorkerToken(uint32_t id) const;

  // Server::Shutdown on every shard, in shard order; they stay in the cluster.
  void Shutdown();
  // Destroys the shards (which shuts them down), then removes the run directory if
  // Start made it. Afterwards the cluster has no shards.
  void Stop();

 private:
  // Starts a shard on each of `ports` (0: any), filling shards_ and addresses_.
  absl::Status StartShards(const ServerOptions& base, const std::vector<uint16_t>& ports);

  std::vector<std::unique_ptr<Server>> shards_;
  std::vector<std::string> addresses_;
  std::string run_dir_;
  bool owns_run_dir_ = false;
};

}  // namespace ps::server
