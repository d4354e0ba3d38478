#include "usrc/net/roce_port.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "usrc/net/ipv4.h"

namespace usrc::net {

std::vector<BpfInsn> steering_program(const std::vector<uint16_t> &slots) {
  // The socket filter sees the UDP payload (the kernel pulls the UDP
  // header before it runs the program): BTH bytes 5-7 are the destination
  // QPN, so the halfword at 5 shifted right by 4 is its slot. A datagram
  // too short for it ends the program with 0, the first socket (which
  // drops it as malformed).
  std::vector<BpfInsn> p;
  p.push_back({BPF_LD | BPF_H | BPF_ABS, 0, 0, 5});
  p.push_back({BPF_ALU | BPF_RSH | BPF_K, 0, 0, 4});
  const size_t n = std::min(slots.size(), kMaxSteered);
  for (size_t i = 0; i < n; i++) {
    p.push_back({BPF_JMP | BPF_JEQ | BPF_K, 0, 1, slots[i]});
    p.push_back({BPF_RET | BPF_K, 0, 0, uint32_t(i)});
  }
  // An index past the group's sockets: the kernel picks one by hash.
  p.push_back({BPF_RET | BPF_K, 0, 0, 0xffffffffu});
  return p;
}

namespace {

std::vector<uint16_t> read_index(const std::string &path) {
  std::vector<uint16_t> v;
  std::ifstream f(path);
  unsigned s;
  while (f >> s) v.push_back(uint16_t(s));
  return v;
}

bool write_index(const std::string &path, const std::vector<uint16_t> &v) {
  const std::string tmp = path + ".new";
  {
    std::ofstream f(tmp, std::ios::trunc);
    for (uint16_t s : v) f << s << "\n";
    if (!f) return false;
  }
  return ::rename(tmp.c_str(), path.c_str()) == 0;
}

int open_lock(const std::string &path) {
  return ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
}

// A member holds a shared lock on its slot's file while it is in the group.
bool alive(const std::string &dir, uint16_t slot) {
  const int fd = ::open((dir + "/s" + std::to_string(slot)).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

bool attach(int fd, const std::vector<uint16_t> &slots) {
  std::vector<BpfInsn> p = steering_program(slots);
  static_assert(sizeof(BpfInsn) == sizeof(sock_filter));
  sock_fprog prog{static_cast<unsigned short>(p.size()), reinterpret_cast<sock_filter *>(p.data())};
  return ::setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) == 0;
}

}  // namespace

RocePort::RocePort(uint32_t ip, uint16_t port, uint16_t slot, const std::string &registry,
                   uint32_t sock_buf, std::string *err)
    : port_(port), slot_(slot) {
  char name[32];
  std::snprintf(name, sizeof name, "/%08x-%u", ip, port);
  ::mkdir(registry.c_str(), 01777);
  ::chmod(registry.c_str(), 01777);   // (mkdir's mode is masked)
  dir_ = registry + name;
  ::mkdir(dir_.c_str(), 0755);
  lock_fd_ = open_lock(dir_ + "/lock");
  slot_lock_ = open_lock(dir_ + "/s" + std::to_string(slot));
  if (lock_fd_ < 0 || slot_lock_ < 0 || ::flock(slot_lock_, LOCK_SH | LOCK_NB) != 0) {
    *err = "registry " + dir_ + ": " + strerror(errno);
    return;
  }
  ::flock(lock_fd_, LOCK_EX);
  fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int one = 1, pmtu = IP_PMTUDISC_DO;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  (void)size_socket_buffers(fd_, sock_buf);
  sockaddr_in a = to_sockaddr({ip, port});
  if (::bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || !update(true)) {
    *err = "UDP port " + std::to_string(port) + ": " + strerror(errno);
    ::close(fd_);
    fd_ = -1;
  }
  ::flock(lock_fd_, LOCK_UN);
}

// The registry after this context joins (appended: the kernel adds a
// socket at the end) or leaves (the last moves into its hole), members that
// died without leaving taken out the same way first; then the group's
// program for the new order.
bool RocePort::update(bool join) {
  const std::string path = dir_ + "/index";
  std::vector<uint16_t> v = read_index(path);
  for (size_t i = 0; i < v.size();) {
    if ((join && v[i] == slot_) || !alive(dir_, v[i])) {   // (ours when joining: a predecessor's)
      v[i] = v.back();
      v.pop_back();
    } else {
      i++;
    }
  }
  if (join) v.push_back(slot_);
  if (!write_index(path, v)) return false;
  return v.empty() || attach(fd_, v);
}

RocePort::~RocePort() {
  if (fd_ >= 0) {
    ::flock(lock_fd_, LOCK_EX);
    // (Leaving: our own entry is the one not alive to update(); unlock
    // our slot first so that it reads as gone.)
    ::flock(slot_lock_, LOCK_UN);
    update(false);
    ::close(fd_);
    ::flock(lock_fd_, LOCK_UN);
  }
  if (slot_lock_ >= 0) ::close(slot_lock_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

}  // namespace usrc::net
