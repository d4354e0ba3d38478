// A plain TCP program for the rsockets preload test (rdmacm2_test.sh):
// `tcp_pair server PORT BYTES` accepts one connection on 0.0.0.0:PORT,
// reads BYTES and answers with their checksum; `tcp_pair client ADDR PORT
// BYTES` sends BYTES of a pattern and checks the answer. Only the socket
// calls librspreload takes over (socket, bind, listen, accept, connect,
// send, recv, close), with plain SOCK_STREAM (no SOCK_CLOEXEC, which
// rsockets refuses and the preload then gives to the kernel).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static uint32_t sum(uint32_t s, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) s = s * 31 + p[i];
  return s;
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + (i >> 11)); }

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: tcp_pair server PORT BYTES | client ADDR PORT BYTES\n");
    return 2;
  }
  const int server = strcmp(argv[1], "server") == 0;
  if (!server && argc < 5) return 2;
  const char *addr = server ? "0.0.0.0" : argv[2];
  const int port = atoi(argv[server ? 2 : 3]);
  const size_t bytes = strtoul(argv[server ? 3 : 4], NULL, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) return 2;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) { perror("socket"); return 1; }
  static unsigned char buf[65536];
  uint32_t check = 0;
  if (server) {
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 1)) { perror("bind/listen"); return 1; }
    int c = accept(s, NULL, NULL);
    if (c < 0) { perror("accept"); return 1; }
    size_t got = 0;
    while (got < bytes) {
      ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      check = sum(check, buf, (size_t)n);
      got += (size_t)n;
    }
    uint32_t be = htonl(check);
    if (send(c, &be, sizeof be, 0) != sizeof be) { perror("send"); return 1; }
    char end;
    (void)!recv(c, &end, 1, 0);   // the client closes first
    close(c);
    close(s);
    printf("tcp_pair: server got %zu bytes\n", got);
    return got == bytes ? 0 : 1;
  }
  if (connect(s, (struct sockaddr *)&sa, sizeof sa)) { perror("connect"); return 1; }
  for (size_t off = 0; off < bytes;) {
    size_t n = bytes - off < sizeof buf ? bytes - off : sizeof buf;
    for (size_t i = 0; i < n; i++) buf[i] = pattern(off + i);
    check = sum(check, buf, n);
    for (size_t done = 0; done < n;) {
      ssize_t w = send(s, buf + done, n - done, 0);
      if (w <= 0) { perror("send"); return 1; }
      done += (size_t)w;
    }
    off += n;
  }
  uint32_t be = 0;
  size_t have = 0;
  while (have < sizeof be) {
    ssize_t n = recv(s, (char *)&be + have, sizeof be - have, 0);
    if (n <= 0) { perror("recv"); return 1; }
    have += (size_t)n;
  }
  close(s);
  if (ntohl(be) != check) {
    printf("tcp_pair: checksum mismatch\n");
    return 1;
  }
  printf("tcp_pair: data ok (%zu bytes)\n", bytes);
  return 0;
}
