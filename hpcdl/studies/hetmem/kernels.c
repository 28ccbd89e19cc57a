/* Mini-app kernels of the hetmem study, each with named data objects whose placement can vary.
 *
 *   kernels APP SIZE ITERS
 *
 * Every object is page-aligned (aligned_alloc) so page ranges never straddle two objects. Before
 * the compute phase the program prints one line per object, "HETMEM_OBJECT name address bytes",
 * and the address of a marker page; it writes the marker once when the compute phase starts and
 * once when it ends, so a tracer can cut exactly that phase out of the whole process's stream.
 * The compute phase's own wall time is printed last ("HETMEM_COMPUTE_S seconds").
 */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PAGE 4096
static volatile char marker[PAGE] __attribute__((aligned(PAGE)));

static void *object(const char *name, size_t bytes) {
    size_t rounded = (bytes + PAGE - 1) / PAGE * PAGE;
    void *p = aligned_alloc(PAGE, rounded);
    if (!p) { fprintf(stderr, "out of memory allocating %s (%zu bytes)\n", name, rounded); exit(2); }
    memset(p, 0, rounded);
    printf("HETMEM_OBJECT %s %lu %zu\n", name, (unsigned long)(uintptr_t)p, rounded);
    return p;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static uint64_t lcg(uint64_t *s) { *s = *s * 6364136223846793005ULL + 1442695040888963407ULL; return *s >> 11; }

static double t0;
static void begin(void) { printf("HETMEM_MARKER %lu\n", (unsigned long)(uintptr_t)marker); fflush(stdout); t0 = now(); marker[0] = 1; }
static void end(double checksum) { marker[0] = 2; printf("HETMEM_COMPUTE_S %.9f\nHETMEM_CHECKSUM %.6e\n", now() - t0, checksum); }

/* STREAM triad: a = b + s*c over n doubles. */
static void stream(long n, int iters) {
    double *a = object("a", n * 8), *b = object("b", n * 8), *c = object("c", n * 8);
    for (long i = 0; i < n; i++) { b[i] = 1.0 + i % 7; c[i] = 2.0; }
    begin();
    for (int it = 0; it < iters; it++)
        for (long i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
    end(a[n / 2]);
}

/* 3-D 7-point Jacobi sweeps on an n^3 grid, ping-ponging between u and v; k holds the weights. */
static void stencil(long n, int iters) {
    long n3 = n * n * n;
    double *u = object("u", n3 * 8), *v = object("v", n3 * 8), *k = object("weights", 8 * 8);
    for (long i = 0; i < n3; i++) u[i] = (double)(i % 11);
    k[0] = 0.4; for (int i = 1; i < 7; i++) k[i] = 0.1;
    begin();
    for (int it = 0; it < iters; it++) {
        for (long z = 1; z < n - 1; z++)
            for (long y = 1; y < n - 1; y++)
                for (long x = 1; x < n - 1; x++) {
                    long i = (z * n + y) * n + x;
                    v[i] = k[0] * u[i] + k[1] * u[i - 1] + k[2] * u[i + 1] + k[3] * u[i - n] +
                           k[4] * u[i + n] + k[5] * u[i - n * n] + k[6] * u[i + n * n];
                }
        double *t = u; u = v; v = t;
    }
    end(u[n3 / 2]);
}

/* Conjugate gradient on a 2-D Laplacian (side m) whose unknowns are randomly permuted: CSR matrix
 * (rowptr, col, val), vectors x, r, p, q; the permutation makes the SpMV gathers from p irregular. */
static void cg(long m, int iters) {
    long n = m * m, nnz = 5 * n;
    int *perm = malloc(n * sizeof(int));
    uint64_t s = 42;
    for (long i = 0; i < n; i++) perm[i] = (int)i;
    for (long i = n - 1; i > 0; i--) { long j = lcg(&s) % (i + 1); int t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    int *rowptr = object("rowptr", (n + 1) * 4), *col = object("colidx", nnz * 4);
    double *val = object("values", nnz * 8), *x = object("x", n * 8), *r = object("r", n * 8);
    double *p = object("p", n * 8), *q = object("q", n * 8);
    long e = 0;
    /* grid point g sits at row perm[g] */
    int *inv = malloc(n * sizeof(int));
    for (long g = 0; g < n; g++) inv[perm[g]] = (int)g;
    e = 0;
    for (long row = 0; row < n; row++) {
        long g = inv[row], gy = g / m, gx = g % m;
        rowptr[row] = (int)e;
        col[e] = perm[g]; val[e++] = 4.0;
        if (gx > 0)     { col[e] = perm[g - 1]; val[e++] = -1.0; }
        if (gx < m - 1) { col[e] = perm[g + 1]; val[e++] = -1.0; }
        if (gy > 0)     { col[e] = perm[g - m]; val[e++] = -1.0; }
        if (gy < m - 1) { col[e] = perm[g + m]; val[e++] = -1.0; }
    }
    rowptr[n] = (int)e;
    for (long i = 0; i < n; i++) { r[i] = 1.0; p[i] = 1.0; }
    double rr = (double)n;
    begin();
    for (int it = 0; it < iters; it++) {
        for (long i = 0; i < n; i++) {
            double acc = 0.0;
            for (int j = rowptr[i]; j < rowptr[i + 1]; j++) acc += val[j] * p[col[j]];
            q[i] = acc;
        }
        double pq = 0.0;
        for (long i = 0; i < n; i++) pq += p[i] * q[i];
        double alpha = rr / pq, rr_new = 0.0;
        for (long i = 0; i < n; i++) { x[i] += alpha * p[i]; r[i] -= alpha * q[i]; rr_new += r[i] * r[i]; }
        double beta = rr_new / rr;
        for (long i = 0; i < n; i++) p[i] = r[i] + beta * p[i];
        rr = rr_new;
    }
    end(rr);
    free(perm); free(inv);
}

/* RandomAccess (GUPS): XOR updates of a 2^size-entry table at pseudo-random indices, generated in
 * blocks of 128 into a small buffer as HPCC does. */
static void gups(long log2n, int iters) {
    long n = 1L << log2n;
    uint64_t *table = object("table", n * 8), *ran = object("ran", 128 * 8);
    for (long i = 0; i < n; i++) table[i] = i;
    uint64_t s = 7;
    begin();
    for (long b = 0; b < (long)iters * n / 128; b++) {
        for (int j = 0; j < 128; j++) ran[j] = lcg(&s);
        for (int j = 0; j < 128; j++) table[ran[j] & (n - 1)] ^= ran[j];
    }
    end((double)table[n / 3]);
}

/* One deep-learning training step, repeated: a two-layer MLP (in -> h -> out, ReLU, squared loss)
 * on a batch; forward, backward and an SGD update. Objects: the batch, targets, weights, the
 * hidden activations and the gradients. */
static void mlp(long h, int iters) {
    long batch = 16, in = 32, out = 8;
    float *xb = object("inputs", batch * in * 4), *yb = object("targets", batch * out * 4);
    float *w1 = object("w1", in * h * 4), *w2 = object("w2", h * out * 4);
    float *act = object("hidden", batch * h * 4), *dact = object("grad_hidden", batch * h * 4);
    float *g1 = object("grad_w1", in * h * 4), *g2 = object("grad_w2", h * out * 4);
    float *o = object("outputs", batch * out * 4);
    uint64_t s = 3;
    for (long i = 0; i < batch * in; i++) xb[i] = (float)(lcg(&s) % 1000) / 1000.0f;
    for (long i = 0; i < batch * out; i++) yb[i] = (float)(lcg(&s) % 1000) / 1000.0f;
    for (long i = 0; i < in * h; i++) w1[i] = ((float)(lcg(&s) % 1000) / 1000.0f - 0.5f) * 0.1f;
    for (long i = 0; i < h * out; i++) w2[i] = ((float)(lcg(&s) % 1000) / 1000.0f - 0.5f) * 0.1f;
    float loss = 0.0f;
    begin();
    for (int it = 0; it < iters; it++) {
        for (long b = 0; b < batch; b++)              /* hidden = relu(x W1) */
            for (long j = 0; j < h; j++) {
                float acc = 0.0f;
                for (long i = 0; i < in; i++) acc += xb[b * in + i] * w1[i * h + j];
                act[b * h + j] = acc > 0 ? acc : 0;
            }
        loss = 0.0f;
        for (long b = 0; b < batch; b++)              /* out = hidden W2; d = out - y */
            for (long k = 0; k < out; k++) {
                float acc = 0.0f;
                for (long j = 0; j < h; j++) acc += act[b * h + j] * w2[j * out + k];
                o[b * out + k] = acc - yb[b * out + k];
                loss += o[b * out + k] * o[b * out + k];
            }
        for (long j = 0; j < h; j++)                  /* dW2 = hidden^T d */
            for (long k = 0; k < out; k++) {
                float acc = 0.0f;
                for (long b = 0; b < batch; b++) acc += act[b * h + j] * o[b * out + k];
                g2[j * out + k] = acc / batch;
            }
        for (long b = 0; b < batch; b++)              /* dhidden = d W2^T * relu' */
            for (long j = 0; j < h; j++) {
                float acc = 0.0f;
                for (long k = 0; k < out; k++) acc += o[b * out + k] * w2[j * out + k];
                dact[b * h + j] = act[b * h + j] > 0 ? acc : 0;
            }
        for (long i = 0; i < in; i++)                 /* dW1 = x^T dhidden */
            for (long j = 0; j < h; j++) {
                float acc = 0.0f;
                for (long b = 0; b < batch; b++) acc += xb[b * in + i] * dact[b * h + j];
                g1[i * h + j] = acc / batch;
            }
        for (long i = 0; i < in * h; i++) w1[i] -= 0.01f * g1[i];
        for (long i = 0; i < h * out; i++) w2[i] -= 0.01f * g2[i];
    }
    end(loss);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s stream|stencil|cg|gups|mlp SIZE ITERS\n", argv[0]); return 2; }
    long size = atol(argv[2]);
    int iters = atoi(argv[3]);
    if (size <= 0 || iters <= 0) { fprintf(stderr, "SIZE and ITERS must be positive\n"); return 2; }
    if (!strcmp(argv[1], "stream")) stream(size, iters);
    else if (!strcmp(argv[1], "stencil")) stencil(size, iters);
    else if (!strcmp(argv[1], "cg")) cg(size, iters);
    else if (!strcmp(argv[1], "gups")) gups(size, iters);
    else if (!strcmp(argv[1], "mlp")) mlp(size, iters);
    else { fprintf(stderr, "unknown app %s\n", argv[1]); return 2; }
    return 0;
}
