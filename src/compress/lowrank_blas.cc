// PowerSGD's products on a CPU BLAS (cblas_sgemm, row-major). Built when CMake finds a BLAS with cblas.h.
#include <cblas.h>

#include "compress/lowrank.h"

namespace ccoll {

void ProductMQ(const float* m, int64_t rows, int64_t cols, const float* q, int r, float* p) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), r, static_cast<int>(cols), 1.0f, m,
              static_cast<int>(cols), q, r, 0.0f, p, r);
}

void ProductMtP(const float* m, int64_t rows, int64_t cols, const float* p, int r, float* q) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(cols), r, static_cast<int>(rows), 1.0f, m,
              static_cast<int>(cols), p, r, 0.0f, q, r);
}

void ProductPQt(const float* p, const float* q, int64_t rows, int64_t cols, int r, float* out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(cols), r, 1.0f, p, r,
              q, r, 0.0f, out, static_cast<int>(cols));
}

}  // namespace ccoll
