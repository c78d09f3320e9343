#include "model/api/engine.h"

namespace maskd {

FastPathOptions FastPathOptions::Fast() {
  FastPathOptions f;
  f.attention = AttentionImpl::kAuto;
  f.cuda_graphs = true;
  f.gpu_preprocess = true;
  f.gpu_postprocess = true;
  return f;
}

}  // namespace maskd
