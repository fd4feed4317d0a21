#include "common/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <mutex>
#include <sstream>

#include "common/logging.h"
#include "common/net.h"
#include "common/version.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

namespace gradsync {

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> buckets = {50e-6,  100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3,
                                              5e-3,   10e-3,  25e-3,  50e-3,  100e-3, 250e-3,
                                              500e-3, 1,      2.5,    5,      10,     30};
  return buckets;
}

namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return prometheus::MetricFamily{name, help, type, {m}};
}

// Fields of /proc/self/stat after the command name: state is field 3, so
// fields[i] is field i + 3 of proc(5).
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  std::vector<std::string> fields;
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return fields;
  std::istringstream rest(line.substr(paren + 1));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double t = 0;
      in >> t;
      return t;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

double OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  double n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // the directory being read
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessCollector::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  const std::vector<std::string> f = StatFields();
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  // proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24.
  if (f.size() > 21 && tick > 0) {
    const double cpu = (std::stod(f[11]) + std::stod(f[12])) / tick;
    out.push_back(Family("process_cpu_seconds_total", "User and system CPU time, in seconds.",
                         MetricType::Counter, cpu));
    out.push_back(Family("process_start_time_seconds",
                         "Start time of the process since the Unix epoch, in seconds.",
                         MetricType::Gauge, BootTimeSeconds() + std::stod(f[19]) / tick));
    out.push_back(Family("process_virtual_memory_bytes", "Virtual memory size, in bytes.",
                         MetricType::Gauge, std::stod(f[20])));
    out.push_back(Family("process_resident_memory_bytes", "Resident memory size, in bytes.",
                         MetricType::Gauge,
                         std::stod(f[21]) * static_cast<double>(sysconf(_SC_PAGESIZE))));
  }
  out.push_back(Family("process_open_fds", "Open file descriptors.", MetricType::Gauge, OpenFds()));
  uint64_t refused = 0, dropped = 0, impostors = 0, sends_dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : auth_failures_) refused += c->load();
    for (const auto& c : dropped_) dropped += c->load();
    for (const auto& c : impostors_) impostors += c->load();
    for (const auto& c : sends_dropped_) sends_dropped += c->load();
  }
  out.push_back(Family("gradsync_sends_dropped_total",
                       "Sends failed at once because too many were already waiting for a "
                       "peer that does not read (max_pending_sends_per_peer).",
                       MetricType::Counter, static_cast<double>(sends_dropped)));
  out.push_back(Family("gradsync_impostors_total",
                       "Messages refused because the identity they came under is not the one "
                       "bound to the sender's node key, or a sealed message (bulk or ring TCP "
                       "stream) that did not open under its key.",
                       MetricType::Counter, static_cast<double>(impostors)));
  out.push_back(Family("gradsync_auth_failures_total",
                       "Connections refused at the handshake: no, wrong or another job's "
                       "CURVE key, or a ring TCP stream's hello (another job, an identity it "
                       "does not take, a node key bound to another identity, no proof of the "
                       "key, garbage or none).",
                       MetricType::Counter, static_cast<double>(refused)));
  out.push_back(Family("gradsync_transport_dropped_total",
                       "Messages dropped as they were read, before any receiver: more "
                       "payload frames or a larger header than any gradsync message has "
                       "(on a ring TCP stream: a frame table out of bounds, which closes it).",
                       MetricType::Counter, static_cast<double>(dropped)));
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(Family("process_max_fds", "Limit on open file descriptors.", MetricType::Gauge,
                         static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

void ProcessCollector::Add(Count auth_failures, Count dropped, Count impostors,
                           Count sends_dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  auth_failures_.push_back(std::move(auth_failures));
  dropped_.push_back(std::move(dropped));
  impostors_.push_back(std::move(impostors));
  sends_dropped_.push_back(std::move(sends_dropped));
}

ProcessMetrics::ProcessMetrics(const std::string& role)
    : registry_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessCollector>()) {
  prometheus::BuildGauge()
      .Name("gradsync_build_info")
      .Help("Build of this process; the value is always 1.")
      .Register(*registry_)
      .Add({{"version", kBuildId}, {"protocol", std::to_string(kProtocolVersion)}, {"role", role}})
      .Set(1);
}

namespace {

// civetweb, under prometheus::Exposer, sets up and tears down its library
// state (mg_init_library, mg_exit_library) without a lock of its own, so the
// Exposers of one process (several communicators, a scheduler beside a
// worker) start and stop one at a time.
std::mutex& ExposerMutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

ProcessMetrics::~ProcessMetrics() {
  std::lock_guard<std::mutex> lock(ExposerMutex());
  exposer_.reset();
}

StatusOr<int> ProcessMetrics::Serve(const std::string& address) {
  if (exposer_) return FailedPreconditionError("metrics are already served");
  try {
    std::unique_ptr<prometheus::Exposer> exposer;
    {
      std::lock_guard<std::mutex> lock(ExposerMutex());
      exposer = std::make_unique<prometheus::Exposer>(address);
    }
    exposer->RegisterCollectable(registry_);
    exposer->RegisterCollectable(process_);
    auto ports = exposer->GetListeningPorts();
    exposer_ = std::move(exposer);
    return ports.empty() ? 0 : ports.front();
  } catch (const std::exception& e) {
    return UnavailableError("cannot serve metrics on " + address + ": " + e.what());
  }
}

int ProcessMetrics::ServeOrWarn(const std::string& host, int64_t port) {
  if (port <= 0) return 0;
  if (port > 65535) {
    GS_LOG(WARNING) << "metrics port " << port << " is not a port; continuing without /metrics";
    return 0;
  }
  auto resolved = BindAddress(host);
  if (!resolved.ok()) {
    GS_LOG(WARNING) << resolved.status().message() << "; continuing without /metrics";
    return 0;
  }
  const std::string address =
      resolved->find(':') == std::string::npos ? *resolved : "[" + *resolved + "]";
  auto bound = Serve(address + ":" + std::to_string(port));
  if (!bound.ok()) {
    GS_LOG(WARNING) << bound.status().message() << " (port busy?); continuing without /metrics";
    return 0;
  }
  GS_LOG(INFO) << "metrics on http://" << address << ":" << *bound << "/metrics";
  return *bound;
}

std::string ProcessMetrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& f : process_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace gradsync
