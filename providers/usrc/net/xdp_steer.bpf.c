// The XDP program of the AF_XDP backend (net/xdp.cpp), built with clang
// -target bpf and carried inside the provider. IPv4/UDP frames for the
// process's port, unfragmented and without IP options, go to the XSK of
// their receive queue; everything else passes on to the kernel.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct {
  __uint(type, BPF_MAP_TYPE_XSKMAP);
  __uint(max_entries, 64);
  __type(key, __u32);
  __type(value, __u32);
} usrc_xsks SEC(".maps");

// The process's UDP port, network order: set before the program is loaded.
volatile const __u16 usrc_port = 0;

// (Multi-buffer aware: it reads the first buffer only, which holds the
// headers; so veth allows it in native mode at any MTU. Frames larger than
// an XSK frame are dropped by the socket: usrc never sends them.)
SEC("xdp.frags")
int usrc_steer(struct xdp_md *ctx) {
  void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
  struct ethhdr *eth = data;
  struct iphdr *ip = (void *)(eth + 1);
  struct udphdr *udp = (void *)(ip + 1);
  if ((void *)(udp + 1) > end) return XDP_PASS;
  if (eth->h_proto != bpf_htons(ETH_P_IP)) return XDP_PASS;
  if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP) return XDP_PASS;
  if (ip->frag_off & bpf_htons(0x3fff)) return XDP_PASS;   // MF or a fragment offset
  if (udp->dest != usrc_port) return XDP_PASS;
  return bpf_redirect_map(&usrc_xsks, ctx->rx_queue_index, XDP_PASS);
}

char _license[] SEC("license") = "GPL";
