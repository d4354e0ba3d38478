/* A two-rank MPI check: a ping-pong of messages of several sizes, each
 * byte checked, then an allreduce; rank 0 prints the round-trip time of
 * the last size. Exit status 0 only if every check passed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(int size, int iter, int i) { return (unsigned char)(size * 7 + iter * 31 + i); }

int main(int argc, char **argv) {
  int rank, n, bad = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n != 2) {
    if (rank == 0) fprintf(stderr, "needs 2 ranks\n");
    MPI_Finalize();
    return 2;
  }
  const int sizes[] = {1, 64, 4096, 65536, 1 << 20};
  const int iters = 50;
  unsigned char *buf = malloc(1 << 20);
  double t = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const int size = sizes[s];
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++) {
      if (rank == 0) {
        for (int i = 0; i < size; i++) buf[i] = pattern(size, it, i);
        MPI_Send(buf, size, MPI_BYTE, 1, it, MPI_COMM_WORLD);
        MPI_Recv(buf, size, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int i = 0; i < size; i++) bad += buf[i] != (unsigned char)(pattern(size, it, i) ^ 0x5a);
      } else {
        MPI_Recv(buf, size, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int i = 0; i < size; i++) {
          bad += buf[i] != pattern(size, it, i);
          buf[i] ^= 0x5a;
        }
        MPI_Send(buf, size, MPI_BYTE, 0, it, MPI_COMM_WORLD);
      }
    }
    t = (MPI_Wtime() - t0) / iters;
  }
  /* An allreduce of a vector: the sum of both ranks' values. */
  enum { kN = 100000 };
  long *v = malloc(kN * sizeof *v), *sum = malloc(kN * sizeof *sum);
  for (int i = 0; i < kN; i++) v[i] = (long)i * (rank + 1);
  MPI_Allreduce(v, sum, kN, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < kN; i++) bad += sum[i] != (long)i * 3;
  int all_bad = 0;
  MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_check: %s; 1 MiB round trip %.1f us\n", all_bad ? "BAD DATA" : "data ok", t * 1e6);
  free(buf), free(v), free(sum);
  MPI_Finalize();
  return all_bad ? 1 : 0;
}
