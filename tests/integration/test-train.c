/* A short training run on the real Fashion-MNIST (Debian's
 * dataset-fashion-mnist): the loss must fall below a stated bound. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <unistd.h>

#include "conf/job.h"
#include "nn/loss.h"
#include "pipeline/trainer.h"
#include "tensor/ops.h"

static Dataset *load_or_skip(const char *split) {
        char probe[512];
        snprintf(probe, sizeof probe, "%s/%s-images-idx3-ubyte.gz", FASHION_MNIST_DIR, split);
        if (access(probe, R_OK) < 0)
                cr_skip_test("SKIP: %s missing: install Debian's dataset-fashion-mnist to run this test", probe);
        Dataset *ds;
        Diag d = {};
        cr_assert_eq(dataset_load_dir(FASHION_MNIST_DIR, split, 10, &ds, &d), 0, "%s", d.text);
        return ds;
}

static void train_steps(const char *job_path, int steps, double loss_bound, double acc_bound) {
        Dataset *train = load_or_skip("train"), *test = load_or_skip("t10k");
        Job job;
        Diag d = {};
        cr_assert_eq(job_load(job_path, &job, &d), 0, "%s", d.text);
        dataset_set_normalization(train, (float)job.data.mean, (float)job.data.std);
        dataset_set_normalization(test, (float)job.data.mean, (float)job.data.std);
        ops_blas_set_threads(2);

        Trainer *t;
        cr_assert_eq(trainer_new(&job.model, &job.optim, &job.train, train, test, &ops_blas, &t, &d), 0, "%s", d.text);
        sampler_shuffle(&t->sampler, 0);
        int B = job.train.batch_size;
        double first = 0, last = 0;
        for (int step = 0; step < steps; step++) {
                int c;
                dataset_gather(train, trace_input(t->trace), t->labels, t->sampler.order + (size_t)step * B, B);
                float loss = trainer_step(t, B, &c);
                cr_assert(loss == loss, "loss is NaN at step %d", step);
                if (step < 20)
                        first += loss / 20;
                if (step >= steps - 50)
                        last += loss / 50;
        }
        double acc, test_loss;
        trainer_evaluate(t, test, &acc, &test_loss);
        cr_log_info("%s: %d steps: loss %.3f -> %.3f, test accuracy %.2f%%", job.name, steps, first, last, 100 * acc);
        cr_expect_gt(first, 1.0, "the untrained loss should be near ln 10 = 2.3, got %.3f", first);
        cr_expect_lt(last, loss_bound, "mean loss of the last 50 steps %.3f, bound %.2f", last, loss_bound);
        cr_expect_gt(acc, acc_bound, "test accuracy %.4f, bound %.2f", acc, acc_bound);
        trainer_free(t);
        dataset_free(train);
        dataset_free(test);
        ops_blas_set_threads(1);
}

/* 300 steps of 128 = 0.64 epochs. */
Test(train, mlp_loss_falls, .timeout = 300) {
        train_steps(SOURCE_ROOT "/config/jobs/fashion-mnist-mlp.job", 300, 0.60, 0.80);
}

/* 300 steps of 64 = 0.32 epochs. */
Test(train, cnn_loss_falls, .timeout = 300) {
        train_steps(SOURCE_ROOT "/config/jobs/fashion-mnist-cnn.job", 300, 0.75, 0.75);
}
