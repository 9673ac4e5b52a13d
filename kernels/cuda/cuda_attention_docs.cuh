// Varlen attention (k_docs): the document bounds a tile's rows see, for the tensor-core
// kernels of cuda_attention.cu and cuda_attention_sm90.cu.  Document starts and ends never
// decrease along a row, so the bounds of a run of rows are those of its first and last row.
// Rows past T count as row T-1.  Without docs (DOCS = false) the bounds are the whole row.
#ifndef FSDP_CUDA_ATTENTION_DOCS_CUH
#define FSDP_CUDA_ATTENTION_DOCS_CUH

__device__ __forceinline__ int imin(int a, int b) {
    return a < b ? a : b;
}

// Query rows: the first key each sees.
struct query_docs {
    int first[2]; // of this lane's rows row_lo + g and row_lo + g + 8
    int lo, hi;   // of rows lo_row and hi_row: the smallest and the largest between them
};

template <bool DOCS>
__device__ __forceinline__ query_docs query_docs_of(const int32_t *doc_start, int b, int T,
                                                    int row_lo, int g, int lo_row, int hi_row) {
    query_docs d = {{0, 0}, 0, 0};
    if (DOCS) {
        const int32_t *start = doc_start + (size_t)b * T;
        d.first[0] = start[imin(row_lo + g, T - 1)];
        d.first[1] = start[imin(row_lo + g + 8, T - 1)];
        d.lo = start[imin(lo_row, T - 1)];
        d.hi = start[imin(hi_row, T - 1)];
    }
    return d;
}

// Key rows: one past the last query that sees each.
struct key_docs {
    int end[2]; // of this lane's keys k_lo + g and k_lo + g + 8
    int lo, hi; // of keys lo_row and hi_row: the smallest and the largest between them
};

template <bool DOCS>
__device__ __forceinline__ key_docs key_docs_of(const int32_t *doc_end, int b, int T, int k_lo,
                                                int g, int lo_row, int hi_row) {
    key_docs d = {{T, T}, T, T};
    if (DOCS) {
        const int32_t *end = doc_end + (size_t)b * T;
        d.end[0] = end[imin(k_lo + g, T - 1)];
        d.end[1] = end[imin(k_lo + g + 8, T - 1)];
        d.lo = end[imin(lo_row, T - 1)];
        d.hi = end[imin(hi_row, T - 1)];
    }
    return d;
}

#endif
