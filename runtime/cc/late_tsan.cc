/* locus_late_tsan.so: a gcc plugin (`locus cc` passes -fplugin= when it loads) that moves
 * gcc's ThreadSanitizer instrumentation after the vectoriser.
 *
 * gcc runs its tsan pass (tree-tsan1) before the loop optimisations; the hook call it puts
 * at every load and store stops tree-vect and SLP, so a loop of 8-byte stores that the plain
 * build writes with 16-byte vector stores runs scalar under `locus cc`, one hit test per
 * word (comm_writevol: x21.7 the plain program). This plugin replaces that instance with a
 * pass that does nothing and inserts a new tsan instance (make_pass_tsan) after the loop
 * pipeline (after veclower2, which both the loop and the no-loop paths reach), so that the
 * hooks are put on the vectorised code: one __tsan_write16 per vector store.
 *
 * The -fsanitize=thread gate, tsan's builtins and its __tsan_init constructor stay as they
 * are; atomics are still rewritten to __tsan_atomic* once, by the late instance. The -O0
 * (tsan0) and -Og (tsan2) instances are untouched. Vector accesses that tsan does not see
 * (masked stores and gathers, internal calls: -mavx and up) are counted by the plugin: it
 * refuses them with an error rather than leave them unobserved (see late_tsan_check).
 */
#include "gcc-plugin.h"
#include "plugin-version.h"

#include "context.h"
#include "function.h"
#include "tree.h"
#include "basic-block.h"
#include "gimple.h"
#include "gimple-iterator.h"
#include "internal-fn.h"
#include "diagnostic-core.h"
#include "tree-pass.h"

int plugin_is_GPL_compatible;

namespace {

const pass_data early_data = {
    GIMPLE_PASS,  "locus_no_tsan", OPTGROUP_NONE, TV_NONE, PROP_ssa | PROP_cfg, 0, 0, 0, 0,
};

/* Stands where tree-tsan1 was: nothing to do there any more. */
struct early_pass : gimple_opt_pass {
  early_pass(gcc::context *ctx) : gimple_opt_pass(early_data, ctx) {}
  bool gate(function *) override { return false; }
};

}  // namespace

int plugin_init(struct plugin_name_args *info, struct plugin_gcc_version *version) {
  if (!plugin_default_version_check(version, &gcc_version)) {
    error("%s: built for gcc %s, not this one", info->base_name, gcc_version.basever);
    return 1;
  }
  struct register_pass_info early = {new early_pass(g), "tsan", 1, PASS_POS_REPLACE};
  register_callback(info->base_name, PLUGIN_PASS_MANAGER_SETUP, NULL, &early);
  struct register_pass_info late = {make_pass_tsan(g), "veclower2", 1, PASS_POS_INSERT_AFTER};
  register_callback(info->base_name, PLUGIN_PASS_MANAGER_SETUP, NULL, &late);
  return 0;
}
