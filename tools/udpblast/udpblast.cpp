// udpblast: the kernel's UDP floor on one path, for side-by-side benchmarks.
// The receiver reports what it saw (Gbit/s of payload, Mpps of messages);
// the sender batches as well as the kernel allows: sendmmsg, and with -g
// UDP GSO (segment = message size, up to 64 KB per datagram train), the
// receiver recvmmsg and with -g UDP GRO.
//
//   udpblast -s [-p PORT] [-g] [-t SECONDS]             receive, print a line
//   udpblast -c HOST [-p PORT] [-m SIZE] [-g] [-t SECONDS]   send for SECONDS
//
// With -P, a ping-pong instead, both sides polling their socket without
// sleeping (as perftest's latency tests poll their CQs): the server echoes
// each datagram, the client sends SIZE bytes (up to one datagram), waits for
// the echo and, after SECONDS, prints the median half round trip
//   udpblast pingpong size=S n=N median_us=M min_us=M
//
// With -L, no sockets: the floor of a same-host transport that moves
// cache lines between cores (usrc's shared-memory ring). Two threads on two
// different CPUs pass one cache line back and forth for SECONDS; prints the
// median of 20 batches' mean round trip
//   udpblast line round_trip_ns=R cpus=A,B
// (round_trip_ns=NaN with one CPU). It drifts with the machine (a virtual
// machine's vCPUs move between host cores): the bench prints it next to
// the message rate.
//
// Messages larger than one datagram (65507 bytes) are sent as 65507-byte
// datagrams. The receiver stops 0.5 s after traffic stops (or after
// SECONDS + 5 with no traffic at all) and prints
//   udpblast rx bytes=B msgs=N secs=S gbps=G mpps=M
#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxDgram = 65507, kBatch = 64, kBuf = 65536;

[[noreturn]] void die(const char *what) {
  perror(what);
  exit(1);
}

void big_buffers(int fd) {
  int sz = 16 << 20;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
}

int receive(int port, bool gro, double secs) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  big_buffers(fd);
  int one = 1;
  if (gro && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) != 0) die("UDP_GRO");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) die("bind");
  timeval tv{0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  printf("udpblast listening on %d\n", port);
  fflush(stdout);

  std::vector<char> buf(kBatch * kBuf);
  std::vector<iovec> iov(kBatch);
  std::vector<mmsghdr> m(kBatch);
  std::vector<char> ctl(kBatch * CMSG_SPACE(sizeof(int)));
  uint64_t bytes = 0, msgs = 0;
  Clock::time_point first{}, last{};
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs + 5));
  for (;;) {
    for (size_t i = 0; i < kBatch; i++) {
      iov[i] = {buf.data() + i * kBuf, kBuf};
      m[i].msg_hdr = {};
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
      m[i].msg_hdr.msg_control = ctl.data() + i * CMSG_SPACE(sizeof(int));
      m[i].msg_hdr.msg_controllen = CMSG_SPACE(sizeof(int));
    }
    int n = recvmmsg(fd, m.data(), kBatch, 0, nullptr);
    auto now = Clock::now();
    if (n <= 0) {
      if (bytes ? now - last > std::chrono::milliseconds(500) : now > give_up) break;
      continue;
    }
    if (!bytes) first = now;
    last = now;
    for (int i = 0; i < n; i++) {
      size_t len = m[i].msg_len, seg = 0;
      for (cmsghdr *c = CMSG_FIRSTHDR(&m[i].msg_hdr); c; c = CMSG_NXTHDR(&m[i].msg_hdr, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) seg = *reinterpret_cast<int *>(CMSG_DATA(c));
      bytes += len;
      msgs += seg ? (len + seg - 1) / seg : 1;
    }
  }
  double s = std::chrono::duration<double>(last - first).count();
  if (s <= 0) s = 1e-9;
  printf("udpblast rx bytes=%llu msgs=%llu secs=%.3f gbps=%.3f mpps=%.4f\n",
         static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(msgs), s,
         bytes * 8 / s / 1e9, msgs / s / 1e6);
  return bytes ? 0 : 2;
}

int send_to(const char *host, int port, size_t size, bool gso, double secs) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  big_buffers(fd);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) die("address");
  if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) die("connect");
  size_t seg = size < kMaxDgram ? size : kMaxDgram;
  // With GSO one send carries up to 64 segments and 64 KB; without, one datagram.
  size_t per = gso ? std::min<size_t>(64, kMaxDgram / seg) : 1;
  int gso_size = static_cast<int>(seg);
  if (per > 1 && setsockopt(fd, SOL_UDP, UDP_SEGMENT, &gso_size, sizeof gso_size) != 0) die("UDP_SEGMENT");
  size_t batch = per > 1 ? 8 : kBatch;
  std::vector<char> buf(seg * per, 'u');
  std::vector<iovec> iov(batch, iovec{buf.data(), buf.size()});
  std::vector<mmsghdr> m(batch);
  for (size_t i = 0; i < batch; i++) {
    m[i].msg_hdr.msg_iov = &iov[i];
    m[i].msg_hdr.msg_iovlen = 1;
  }
  uint64_t sent = 0, errs = 0;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs));
  while (Clock::now() < end) {
    int n = sendmmsg(fd, m.data(), batch, 0);
    if (n < 0) errs++;  // ECONNREFUSED/ENOBUFS: keep going, the receiver counts
    else sent += n * buf.size();
  }
  double s = std::chrono::duration<double>(Clock::now() - start).count();
  printf("udpblast tx bytes=%llu secs=%.3f gbps=%.3f errors=%llu seg=%zu gso=%zu\n",
         static_cast<unsigned long long>(sent), s, sent * 8 / s / 1e9,
         static_cast<unsigned long long>(errs), seg, per);
  return 0;
}

// Busy-polled ping-pong (-P): the kernel's floor for a polling verbs
// program's round trip, without the wake-up a blocking socket adds.
int pingpong_server(int port, double secs) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) die("bind");
  printf("udpblast listening on %d\n", port);
  fflush(stdout);
  std::vector<char> buf(kBuf);
  uint64_t msgs = 0;
  auto last = Clock::now();
  const auto give_up = last + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs + 5));
  for (;;) {
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    ssize_t n = recvfrom(fd, buf.data(), buf.size(), MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&from), &fl);
    if (n < 0) {
      auto now = Clock::now();
      if (msgs ? now - last > std::chrono::milliseconds(500) : now > give_up) break;
      continue;
    }
    sendto(fd, buf.data(), n, 0, reinterpret_cast<sockaddr *>(&from), fl);
    msgs++;
    last = Clock::now();
  }
  return msgs ? 0 : 2;
}

int pingpong_client(const char *host, int port, size_t size, double secs) {
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) die("address");
  if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) die("connect");
  size = std::min(size, kMaxDgram);
  std::vector<char> out(size, 'u'), in(kBuf);
  std::vector<double> rtt;
  const auto start = Clock::now();
  const auto run = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs));
  const auto end = start + run, warm_end = start + run / 10;
  // Warm-up: 1000 round trips or the first tenth of the run, whichever
  // ends first (a loaded machine may not finish 1000 in the whole run).
  for (int warm = -1000; Clock::now() < end; warm++) {
    if (warm < 0 && Clock::now() >= warm_end) warm = 0;
    const auto t0 = Clock::now();
    if (send(fd, out.data(), size, 0) < 0) die("send");
    ssize_t n;
    // A lost datagram (loopback drops none unless its buffer overflows)
    // would stall the loop: give up on it after a second.
    while ((n = recv(fd, in.data(), in.size(), MSG_DONTWAIT)) < 0)
      if (Clock::now() - t0 > std::chrono::seconds(1)) break;
    if (n < 0) continue;
    if (warm >= 0) rtt.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  if (rtt.empty()) {
    fprintf(stderr, "udpblast: no echo from %s:%d\n", host, port);
    return 2;
  }
  std::sort(rtt.begin(), rtt.end());
  printf("udpblast pingpong size=%zu n=%zu median_us=%.3f min_us=%.3f\n", size, rtt.size(),
         rtt[rtt.size() / 2] / 2, rtt[0] / 2);
  return 0;
}

bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

int line_round_trip(double secs) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) die("sched_getaffinity");
  int cpu[2] = {-1, -1};
  for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &allowed)) cpu[k++] = c;
  if (cpu[1] < 0) {
    printf("udpblast line round_trip_ns=NaN cpus=%d\n", cpu[0]);
    return 0;
  }
  alignas(128) static std::atomic<uint64_t> line{0};
  constexpr int kBatches = 20;
  const uint64_t per_batch = std::max<uint64_t>(1000, uint64_t(secs * 1e9 / 200 / kBatches));
  std::atomic<bool> pinned{true};
  std::thread echo([&] {
    if (!pin(cpu[1])) pinned = false;
    for (uint64_t i = 0; i < kBatches * per_batch; i++) {
      while (line.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      line.store(2 * i + 2, std::memory_order_release);
    }
  });
  if (!pin(cpu[0])) pinned = false;
  std::vector<double> ns;
  for (int b = 0; b < kBatches; b++) {
    const auto t0 = Clock::now();
    for (uint64_t j = 0; j < per_batch; j++) {
      const uint64_t i = uint64_t(b) * per_batch + j;
      line.store(2 * i + 1, std::memory_order_release);
      while (line.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / double(per_batch));
  }
  echo.join();
  if (!pinned) {
    fprintf(stderr, "udpblast: could not pin the threads to CPUs %d and %d\n", cpu[0], cpu[1]);
    return 2;
  }
  std::sort(ns.begin(), ns.end());
  printf("udpblast line round_trip_ns=%.1f cpus=%d,%d\n", ns[kBatches / 2], cpu[0], cpu[1]);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  const char *host = nullptr;
  bool server = false, gso = false, pingpong = false, line = false;
  int port = 19999;
  size_t size = 65536;
  double secs = 2;
  int o;
  while ((o = getopt(argc, argv, "sc:p:m:gPLt:")) != -1) switch (o) {
      case 's': server = true; break;
      case 'c': host = optarg; break;
      case 'p': port = atoi(optarg); break;
      case 'm': size = strtoull(optarg, nullptr, 0); break;
      case 'g': gso = true; break;
      case 'P': pingpong = true; break;
      case 'L': line = true; break;
      case 't': secs = atof(optarg); break;
      default:
        fprintf(stderr,
                "usage: udpblast -s [-p PORT] [-g|-P] [-t S] | -c HOST [-p PORT] [-m SIZE] [-g|-P] [-t S]"
                " | -L [-t S]\n");
        return 1;
    }
  if (line) return line_round_trip(secs);
  if (server == (host != nullptr) || size == 0) {
    fprintf(stderr, "udpblast: give exactly one of -s or -c HOST, and a size > 0\n");
    return 1;
  }
  if (pingpong) return server ? pingpong_server(port, secs) : pingpong_client(host, port, size, secs);
  return server ? receive(port, gso, secs) : send_to(host, port, size, gso, secs);
}
