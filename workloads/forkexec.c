/* forkexec [--truth]
 *
 * Three process images with known lock counts:
 *   parent  parent_lock 100 times (60 by main, 30 of them before fork, and 40 by a helper
 *           thread that is still running when main forks)
 *   child   child_lock 50 times, then exec()s this program again with --exec-child
 *   exec    exec_lock 25 times in the new image (same pid as the child), then exits 0
 * The parent waits for the child and prints the truth with the pids. locus must give the
 * child its own sub-run and the exec'd image its own process entry, and count each lock
 * in the process that used it.
 */
#include <pthread.h>
#include <sys/wait.h>

#include "common.h"

#define PARENT_MAIN_BEFORE 30
#define PARENT_MAIN_AFTER 30
#define PARENT_HELPER 40
#define CHILD_LOCKS 50
#define EXEC_LOCKS 25

pthread_mutex_t parent_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t child_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t exec_lock = PTHREAD_MUTEX_INITIALIZER;

static void lock_n(pthread_mutex_t *m, int n, long pause_us) {
  for (int i = 0; i < n; i++) {
    WL_CHECK(pthread_mutex_lock(m));
    WL_CHECK(pthread_mutex_unlock(m));
    if (pause_us > 0) {
      usleep((useconds_t)pause_us);
    }
  }
}

static void *helper(void *arg) {
  (void)arg;
  lock_n(&parent_lock, PARENT_HELPER, 1000);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--exec-child") == 0) {
    lock_n(&exec_lock, EXEC_LOCKS, 0);
    return 0;
  }
  int truth = wl_take_truth_flag(&argc, argv);
  pthread_t tid;
  WL_CHECK(pthread_create(&tid, NULL, helper, NULL));
  lock_n(&parent_lock, PARENT_MAIN_BEFORE, 0);
  fflush(NULL);
  pid_t child = fork();
  if (child < 0) {
    wl_die("fork", errno);
  }
  if (child == 0) {
    lock_n(&child_lock, CHILD_LOCKS, 0);
    char *args[] = {argv[0], "--exec-child", NULL};
    execv("/proc/self/exe", args);
    _exit(126);
  }
  lock_n(&parent_lock, PARENT_MAIN_AFTER, 0);
  WL_CHECK(pthread_join(tid, NULL));
  int status;
  if (waitpid(child, &status, 0) != child) {
    wl_die("waitpid", errno);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "forkexec: child failed (status 0x%x)\n", status);
    return 1;
  }
  printf("forkexec: parent %d, child %d\n", (int)getpid(), (int)child);
  if (truth) {
    fprintf(stderr,
            "{\"workload\":\"forkexec\",\"processes\":["
            "{\"role\":\"parent\",\"pid\":%d,\"locks\":{\"parent_lock\":%d}},"
            "{\"role\":\"child\",\"pid\":%d,\"locks\":{\"child_lock\":%d}},"
            "{\"role\":\"exec\",\"pid\":%d,\"locks\":{\"exec_lock\":%d}}]}\n",
            (int)getpid(), PARENT_MAIN_BEFORE + PARENT_MAIN_AFTER + PARENT_HELPER, (int)child,
            CHILD_LOCKS, (int)child, EXEC_LOCKS);
  }
  return 0;
}
