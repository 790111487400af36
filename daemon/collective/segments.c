/* collective/segments.c — cutting the vector at every cluster's boundaries. */
#include <errno.h>
#include <stdlib.h>

#include "segments.h"
#include "util/macro.h"

static int cmp_size(const void *a, const void *b) {
        size_t x = *(const size_t *)a, y = *(const size_t *)b;
        return (x > y) - (x < y);
}

static int cmp_unsigned(const void *a, const void *b) {
        unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
        return (x > y) - (x < y);
}

int segments_plan(const ClusterCut *cuts, unsigned n_clusters, size_t total, Segment **ret, size_t *ret_n) {
        size_t n_bounds = 0;
        if (n_clusters == 0 || n_clusters > SEGMENTS_MAX_OWNERS || total == 0)
                return -EINVAL;
        for (unsigned c = 0; c < n_clusters; c++) {
                const ClusterCut *k = &cuts[c];
                if (k->n_stages == 0 || k->bounds[0] != 0 || k->bounds[k->n_stages] != total)
                        return -EINVAL;
                for (unsigned s = 0; s < k->n_stages; s++)
                        if (k->bounds[s] >= k->bounds[s + 1])
                                return -EINVAL;
                n_bounds += k->n_stages + 1;
        }

        _cleanup_(freep) size_t *all = malloc(n_bounds * sizeof *all);
        if (!all)
                return -ENOMEM;
        n_bounds = 0;
        for (unsigned c = 0; c < n_clusters; c++)
                for (unsigned s = 0; s <= cuts[c].n_stages; s++)
                        all[n_bounds++] = cuts[c].bounds[s];
        qsort(all, n_bounds, sizeof *all, cmp_size);
        size_t n = 0;
        for (size_t i = 0; i < n_bounds; i++) /* unique */
                if (n == 0 || all[i] != all[n - 1])
                        all[n++] = all[i];

        if (n < 2) /* cannot happen: 0 and total differ */
                return -EINVAL;
        _cleanup_(freep) Segment *seg = calloc(n - 1, sizeof *seg);
        if (!seg)
                return -ENOMEM;
        for (size_t i = 0; i + 1 < n; i++) {
                Segment *s = &seg[i];
                s->off = all[i];
                s->len = all[i + 1] - all[i];
                s->group = (uint32_t)(i + 1);
                for (unsigned c = 0; c < n_clusters; c++) {
                        const ClusterCut *k = &cuts[c];
                        unsigned st = 0;
                        while (k->bounds[st + 1] <= s->off)
                                st++;
                        s->owners[s->n_owners++] = k->owners[st];
                }
                qsort(s->owners, s->n_owners, sizeof *s->owners, cmp_unsigned);
                for (unsigned j = 1; j < s->n_owners; j++)
                        if (s->owners[j] == s->owners[j - 1])
                                return -EINVAL; /* one node in two clusters */
        }
        *ret = TAKE_PTR(seg);
        *ret_n = n - 1;
        return 0;
}

int ring_grid(unsigned n, unsigned width, RingGrid *ret) {
        if (n < 1 || n > SEGMENTS_MAX_OWNERS || width < 2 || width > COLL_MAX_MEMBERS)
                return -EINVAL;
        unsigned dims = 1, side = 2;
        for (uint64_t cells = width; cells < n; cells *= width)
                dims++;
        for (;; side++) { /* side^dims >= n; n <= 1024 bounds the loop */
                uint64_t cells = 1;
                for (unsigned d = 0; d < dims; d++)
                        cells *= side;
                if (cells >= n)
                        break;
        }
        *ret = (RingGrid){ .n = n, .dims = dims, .side = dims == 1 ? n : side };
        return 0;
}

unsigned ring_grid_group(const RingGrid *g, unsigned pos, unsigned dim, unsigned out[COLL_MAX_MEMBERS]) {
        unsigned stride = 1, n = 0;
        for (unsigned d = 0; d < dim % g->dims; d++)
                stride *= g->side;
        unsigned digit = pos / stride % g->side, base = pos - digit * stride;
        for (unsigned v = 0; v < g->side; v++)
                if (base + v * stride < g->n)
                        out[n++] = base + v * stride;
        return n;
}
