# Reference solution of notebook 07's exercise: one step of ReBridge-Flow as written (Eqs. 3, 7, 8, 9).
rho, lam, kappa = 1.0, 1.0, 5.0
t = t_k
v = prior.velocity(x_k, t)
a_hat, b_hat = x_k - t * v, x_k + (1 - t) * v                                       # Eq. 3: local endpoints
D = lam + kappa * (1 - t) ** 2
gamma = op_ex.sigma_y**2 * (rho + kappa * lam * t**2 / D)                           # gamma_t
b_bar = b_hat + op_ex.H_adjoint(op_ex.solve_HHt_plus(y_ex - op_ex.H(b_hat), gamma))  # Eq. 7: clean-side anchoring
a_bar = (lam * a_hat + kappa * (1 - t) * (x_k - t * b_bar)) / D                     # Eq. 8: source-side re-coupling
answer = x_k + dt * (b_bar - a_bar)                                                 # Eq. 9: the Euler step
