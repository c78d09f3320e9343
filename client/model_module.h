// The boundary between maskctl and libmaskctl_model.so, the module that runs maskctl's model
// subcommands (verify-golden, make-checkpoint, inspect-checkpoint) on the real engine. maskctl loads
// it with dlopen only when one of those subcommands runs, so RPC commands (health, segment, ...) start
// without LibTorch and the CUDA libraries (about 0.6 s per process on the GPU host).
//
// Plain C on purpose: no torch, CLI11 or standard-library types cross the boundary, so the two sides
// only have to agree on this struct. Bump MASKCTL_MODEL_ABI_VERSION whenever it changes; maskctl
// refuses a module of another version instead of reading a struct it does not know.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define MASKCTL_MODEL_ABI_VERSION 1
#define MASKCTL_MODEL_MODULE_NAME "libmaskctl_model.so"
// The variable that names the module's file and skips the search next to maskctl.
#define MASKCTL_MODEL_MODULE_ENV "MASKCTL_MODEL_MODULE"
#define MASKCTL_MODEL_ABI_VERSION_SYMBOL "maskctl_model_abi_version"
#define MASKCTL_MODEL_RUN_SYMBOL "maskctl_model_run"

#ifdef __cplusplus
extern "C" {
#endif

enum MaskctlModelCommand {
  kMaskctlVerifyGolden = 1,
  kMaskctlMakeCheckpoint = 2,
  kMaskctlInspectCheckpoint = 3,
};

// The parsed options of one subcommand; fields of the other subcommands are left zero. Strings are
// NUL-terminated and owned by the caller for the duration of the call. maskctl has already validated
// them (CLI11 checks, --dtype and --attention parsed), so the module's errors are run-time ones.
struct MaskctlModelArgs {
  int command;  // MaskctlModelCommand
  // verify-golden
  const char* dir;
  const char* device;
  const char* dtype;
  const char* attention;
  const char* const* images;
  size_t image_count;
  int no_png;
  int fast;
  const char* json;  // "" = no JSON file
  // make-checkpoint
  const char* arch;
  const char* out;
  uint64_t seed;
  // inspect-checkpoint
  const char* checkpoint;
  int timings;
};

// Both return plain ints; the module writes its results to stdout and errors to stderr (C stdio, the
// same streams as maskctl's), exactly as the subcommands did when they were linked into maskctl.
typedef int (*MaskctlModelAbiVersionFn)(void);
// Returns the subcommand's exit code (0 success; verify-golden 1 = a tolerance exceeded, 2 = could not
// run; make-checkpoint and inspect-checkpoint 1 = failed).
typedef int (*MaskctlModelRunFn)(const struct MaskctlModelArgs* args);

#ifdef __cplusplus
}
#endif
