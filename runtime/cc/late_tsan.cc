/* locus_late_tsan.so: a gcc plugin (`locus cc` passes -fplugin= when gcc accepts it, see
 * python/locus/cc.py) that moves gcc's ThreadSanitizer instrumentation after the vectoriser.
 *
 * gcc runs its tsan pass (tree-tsan1) before the loop optimisations, and the hook call it
 * puts at every load and store stops tree-vect and SLP: a loop of 8-byte stores that the
 * plain build writes with 16-byte vector stores ran scalar under `locus cc`, one hit test
 * per word (comm_writevol: x21.0-22.9 the plain program; x6.6-10.5 with this plugin). This
 * plugin replaces that instance and inserts a second one after the loop pipeline (after
 * veclower2, which both the loop and the no-loop paths reach), so that the hooks go on the
 * optimised code: one __tsan_write16 per vector store, as the plain program does one store.
 *
 * Per function, one of the two runs, never both (atomics are rewritten to __tsan_atomic*
 * once): the late one, unless the function's target can do masked vector loads or stores
 * (AVX and up: -mavx, -march=native...). The vectoriser then emits masked stores, gathers
 * and scatters, internal calls that tsan does not instrument, which late instrumentation
 * would leave unobserved: those functions keep the early instrumentation (as without the
 * plugin). The -fsanitize=thread gate, tsan's builtins and its __tsan_init constructor are
 * gcc's; the -O0 (tsan0) and -Og (tsan2) instances are left alone.
 *
 * After the late pass, a range hook of a constant power-of-two size up to 16 (tsan's form
 * for a vector access it cannot prove aligned) becomes __tsan_unaligned_read/writeN, the
 * same access, so that gas.py inlines its hit test (a range call always takes the slow
 * path of liblocus.so).
 */
#include "gcc-plugin.h"
#include "plugin-version.h"

#include "backend.h"
#include "tree.h"
#include "gimple.h"
#include "ssa.h"
#include "gimple-iterator.h"
#include "stringpool.h"
#include "context.h"
#include "diagnostic-core.h"
#include "tree-pass.h"
#include "ggc.h"

int plugin_is_GPL_compatible;

/* optabs-query.h, which Debian's gcc-12-plugin-dev cannot compile (insn-opinit.h is not
 * shipped); cc1 exports it. */
bool can_vec_mask_load_store_p(machine_mode, machine_mode, bool);

namespace {

/* Whether the function's target can do masked vector loads or stores of some element
 * mode (x86: AVX); gathers and scatters need more (AVX2, AVX-512). */
bool masked_vectors(void) {
  static const machine_mode modes[] = {QImode, HImode, SImode, DImode, SFmode, DFmode};
  for (machine_mode m : modes)
    if (can_vec_mask_load_store_p(m, VOIDmode, true) ||
        can_vec_mask_load_store_p(m, VOIDmode, false))
      return true;
  return false;
}

/* __tsan_unaligned_readN / __tsan_unaligned_writeN (__tsan_read1 / __tsan_write1 for
 * N = 1), declared here: gcc 12 has no builtins for them. */
tree decls[2 * 17]; // a GC root (plugin_init)

tree hook(bool read, unsigned long n) {
  tree &d = decls[read * 17 + n];
  if (d == NULL_TREE) {
    char name[40];
    snprintf(name, sizeof name, n == 1 ? "__tsan_%s%lu" : "__tsan_unaligned_%s%lu",
             read ? "read" : "write", n);
    d = build_fn_decl(name, build_function_type_list(void_type_node, ptr_type_node, NULL_TREE));
    TREE_NOTHROW(d) = 1;
    DECL_ATTRIBUTES(d) = tree_cons(get_identifier("leaf"), NULL_TREE, NULL_TREE);
  }
  return d;
}

/* __tsan_{read,write}_range(p, n), n a constant 1, 2, 4, 8 or 16: the same access through
 * the hook of that size (unaligned for n > 1). */
void sized_ranges(function *fun) {
  basic_block bb;
  FOR_EACH_BB_FN(bb, fun) {
    for (gimple_stmt_iterator gsi = gsi_start_bb(bb); !gsi_end_p(gsi);) {
      gimple *stmt = gsi_stmt(gsi);
      tree callee = is_gimple_call(stmt) ? gimple_call_fndecl(stmt) : NULL_TREE;
      bool read = callee && fndecl_built_in_p(callee, BUILT_IN_TSAN_READ_RANGE);
      if (!read && !(callee && fndecl_built_in_p(callee, BUILT_IN_TSAN_WRITE_RANGE))) {
        gsi_next(&gsi);
        continue;
      }
      tree size = gimple_call_arg(stmt, 1);
      if (!tree_fits_uhwi_p(size)) {
        gsi_next(&gsi);
        continue;
      }
      unsigned long n = tree_to_uhwi(size);
      if (n > 16 || (n & (n - 1)) != 0) {
        gsi_next(&gsi);
        continue;
      }
      gcall *call = gimple_build_call(hook(read, n), 1, gimple_call_arg(stmt, 0));
      gimple_set_location(call, gimple_location(stmt));
      gsi_insert_before(&gsi, call, GSI_SAME_STMT);
      unlink_stmt_vdef(stmt);
      gsi_remove(&gsi, true); // gsi now at the statement after
    }
  }
}

/* A copy of tsan's pass_data under another name. */
pass_data renamed(const opt_pass &tsan, const char *name) {
  pass_data d = tsan;
  d.name = name;
  return d;
}

/* gcc's tsan pass, run where it stands (early) or after the vectoriser (late), for the
 * functions of its half. */
struct tsan_where : gimple_opt_pass {
  opt_pass *tsan;
  bool late;
  tsan_where(gcc::context *ctx, opt_pass *t, bool l)
      : gimple_opt_pass(renamed(*t, l ? "locus_tsan_late" : "locus_tsan_early"), ctx),
        tsan(t),
        late(l) {}
  bool gate(function *fun) override { return tsan->gate(fun) && late != masked_vectors(); }
  unsigned int execute(function *fun) override {
    unsigned int todo = tsan->execute(fun);
    if (late) sized_ranges(fun);
    return todo;
  }
};

} // namespace

int plugin_init(struct plugin_name_args *info, struct plugin_gcc_version *version) {
  if (!plugin_default_version_check(version, &gcc_version)) {
    error("%s: built for gcc %s, not this one", info->base_name, gcc_version.basever);
    return 1;
  }
  static const ggc_root_tab roots[] = {
      {decls, sizeof decls / sizeof *decls, sizeof *decls, &gt_ggc_mx_tree_node,
       &gt_pch_nx_tree_node},
      LAST_GGC_ROOT_TAB,
  };
  register_callback(info->base_name, PLUGIN_REGISTER_GGC_ROOTS, NULL, (void *)roots);
  struct register_pass_info early = {new tsan_where(g, make_pass_tsan(g), false), "tsan", 1,
                                     PASS_POS_REPLACE};
  register_callback(info->base_name, PLUGIN_PASS_MANAGER_SETUP, NULL, &early);
  struct register_pass_info late = {new tsan_where(g, make_pass_tsan(g), true), "veclower2", 1,
                                    PASS_POS_INSERT_AFTER};
  register_callback(info->base_name, PLUGIN_PASS_MANAGER_SETUP, NULL, &late);
  return 0;
}
