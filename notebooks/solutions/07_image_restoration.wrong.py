# expect: is the clean-side-only reading   (the check's message must say this: it recognised the mistake)
# A plausible wrong attempt at notebook 07's exercise: the clean side is anchored (Eq. 7), but the step forgets the
# source side's re-coupling (Eq. 8) and uses a_hat: the "clean-side anchoring only" reading of the paper's ablation.
rho, lam, kappa = 1.0, 1.0, 5.0
t = t_k
v = prior.velocity(x_k, t)
a_hat, b_hat = x_k - t * v, x_k + (1 - t) * v
gamma = op_ex.sigma_y**2 * (rho + kappa * lam * t**2 / (lam + kappa * (1 - t) ** 2))
b_bar = b_hat + op_ex.H_adjoint(op_ex.solve_HHt_plus(y_ex - op_ex.H(b_hat), gamma))
answer = x_k + dt * (b_bar - a_hat)
